"""`docker compose up` in compose/ with only the committed defaults (.env + rendered/config) starts the rehearsal:
compose waits for the server's readiness healthcheck, then the trainer trains and every adapter load succeeds.

A project name, volume and port of its own keep it apart from `grpo-deploy up`'s run; it stops after the second
optimizer step (the full 40 steps are the rehearsal test's job) and removes its containers and volumes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from grpo_deploy.common.metrics import parse_events
from tests import compose as compose_mod
from tests.integration.conftest import REPO

PROJECT = "grpo-test-compose"
METRICS = "/shared/runs/rehearsal/metrics.jsonl"  # compose/rendered/config/trainer.yaml
TIMEOUT_S = 900


@pytest.fixture()
def plain_compose(cpu_image, docker_client):
    env = {**os.environ, "COMPOSE_PROJECT_NAME": PROJECT, "GRPO_VOLUME": PROJECT, "GRPO_SERVER_PORT": "18100"}

    def compose(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "compose", *args], cwd=REPO / "compose", env=env, check=check,
                              capture_output=True, text=True, timeout=TIMEOUT_S)

    compose("down", "--volumes", check=False)
    try:
        yield compose
    finally:
        compose("down", "--volumes", "--timeout", "5", check=False)
    left = docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={PROJECT}"})
    assert [c.name for c in left] == []


def _trainer(docker_client):
    found = docker_client.containers.list(
        all=True, filters={"label": [f"com.docker.compose.project={PROJECT}", "com.docker.compose.service=trainer"]})
    return found[0] if found else None


def test_plain_docker_compose_up_trains(plain_compose, docker_client):
    # `up -d` returns once the trainer is started, i.e. after the server's healthcheck (model in /v1/models) passed.
    plain_compose("up", "-d")
    server = docker_client.containers.list(
        filters={"label": [f"com.docker.compose.project={PROJECT}", "com.docker.compose.service=server"]})[0]
    assert server.attrs["State"]["Health"]["Status"] == "healthy"

    deadline, events = time.time() + TIMEOUT_S, []
    while time.time() < deadline:
        trainer = _trainer(docker_client)
        text = compose_mod.read_file(trainer, METRICS) or ""
        events = parse_events(text)
        if sum(e["event"] == "step" for e in events) >= 2:
            break
        trainer.reload()
        assert trainer.status == "running", trainer.logs(tail=30).decode(errors="replace")
        time.sleep(3)
    steps = [e for e in events if e["event"] == "step"]
    loads = [e for e in events if e["event"] == "adapter_load"]
    assert len(steps) >= 2, f"no second optimizer step within {TIMEOUT_S} s: {json.dumps(events[-3:])}"
    assert loads and all(e["ok"] for e in loads), loads
    start = next(e for e in events if e["event"] == "run_start")
    assert (start["uid"], start["gid"], start["umask"]) == (1000, 1000, "0022")
    assert _trainer(docker_client).attrs["Config"]["User"] == "1000:1000"
