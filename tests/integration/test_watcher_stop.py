"""The run watcher on the real CPU rehearsal (vLLM CPU server + TRL async trainer in containers), set to stop: a bar no
reward can clear (min_gain 1000 per 5-step window) makes the reward "flat" from the first full window; after 3 more
steps of patience the trainer saves and stops. `up` exits 0 and says so, the checkpoint of the stop is complete and
kept, and `status` states the stop and the compute it spared against the planned end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from grpo_deploy.common.metrics import read_events
from tests.specs import spec_data

RUN, MAX_STEPS, SAVE_EVERY = "watched", 24, 6
WATCH = {"action": "stop", "window": 5, "patience": 3, "min_gain": 1000.0}


def cli(cwd, spec, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_deploy.cli", *args, "-f", str(spec)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def watched(tmp_path_factory, cpu_image, docker_client):
    cwd = tmp_path_factory.mktemp("watched")
    data = spec_data("cpu", "trl-async", (), **{"run.name": RUN, "checkpoints.save_every": SAVE_EVERY,
                                                 "watch": WATCH, "overrides": {"trl": {"max_steps": MAX_STEPS}}})
    spec = cwd / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    up = cli(cwd, spec, "up", "--fresh", "--keep", timeout=1800)
    print(up.stdout[-5000:])
    status = cli(cwd, spec, "status", "--json")
    listing = cli(cwd, spec, "checkpoints", "list", "--json")
    text = cli(cwd, spec, "status")
    yield {"up": up, "status": json.loads(status.stdout) if status.returncode == 0 else {"error": status.stderr},
           "checkpoints": json.loads(listing.stdout) if listing.returncode == 0 else {"error": listing.stderr},
           "status_text": text.stdout, "events": read_events(str(cwd / ".grpo-deploy" / RUN / "metrics.jsonl"))}
    cli(cwd, spec, "down")


def test_up_says_the_watcher_stopped_the_run_and_exits_zero(watched):
    up = watched["up"]
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
    assert "run watcher: reward flat since step" in up.stdout, up.stdout[-3000:]
    assert "stopped early: run watcher:" in up.stdout, up.stdout[-3000:]


def test_the_trainer_stopped_after_patience_with_a_complete_checkpoint_of_its_last_step(watched):
    events = watched["events"]
    ends = [e for e in events if e["event"] == "run_end"]
    assert ends[-1]["status"] == "stopped-early", ends
    stopped = int(ends[-1]["steps"])
    warned = next(e["step"] for e in events if e["event"] == "watch" and e["kind"] == "plateau")
    asked = next(e["step"] for e in events if e["event"] == "watch" and e["kind"] == "plateau_stop")
    assert warned == WATCH["window"] and asked == warned + WATCH["patience"], (warned, asked)
    assert stopped == asked + 1 < MAX_STEPS  # the step after the log that asked: its end saves and stops
    steps = sorted(int(e["step"]) for e in events if e["event"] == "step")
    assert steps[-1] == stopped
    listing = watched["checkpoints"]
    rows = listing.get("checkpoints", listing) if isinstance(listing, dict) else listing
    complete = [c["step"] for c in rows if c.get("state") == "complete"]
    assert stopped in complete and SAVE_EVERY in complete, listing  # the stop's own save, off the save cadence


def test_status_states_the_stop_and_what_it_spared(watched):
    s = watched["status"]
    assert s.get("state") == "stopped-early", s
    assert s["watch"]["stop_step"] == s["steps"] - 1 and s["watch"]["total_steps"] == MAX_STEPS, s["watch"]
    assert any(f["kind"] == "plateau_stop" for f in s["watch_findings"]), s["watch_findings"]
    spared = MAX_STEPS - s["steps"]
    assert "stopped early       run watcher:" in watched["status_text"], watched["status_text"]
    assert f"{spared} planned steps not run (~" in watched["status_text"], watched["status_text"]
