"""Health command: server readiness from /v1/models, trainer liveness from its heartbeat file, the Ray head and
worker from their cluster's GCS port (a real listening socket stands for the GCS)."""

import os
import socket
import time

import pytest

from grpo_deploy.runtime import health
from tests.unit.runtime.stub_server import StubServer

MODELS = {"data": [{"id": "tiny-qwen2"}, {"id": "trl-policy-v3"}]}


def test_server_ready_only_when_the_model_is_listed():
    with StubServer({("GET", "/v1/models"): (200, MODELS)}) as server:
        port = str(server.port)
        assert health.main(["--role", "server", "--port", port, "--model", "tiny-qwen2"]) == 0
        assert health.main(["--role", "server", "--port", port, "--model", "other"]) == 1
    assert health.main(["--role", "server", "--port", port, "--model", "tiny-qwen2", "--timeout", "1"]) == 1


def test_server_role_and_model_from_env(monkeypatch):
    with StubServer({("GET", "/v1/models"): (200, MODELS)}) as server:
        monkeypatch.setenv("GRPO_ROLE", "server")
        monkeypatch.setenv("GRPO_SERVED_MODEL", "tiny-qwen2")
        monkeypatch.setenv("GRPO_SERVER_PORT", str(server.port))
        assert health.main([]) == 0
    monkeypatch.delenv("GRPO_SERVED_MODEL")
    assert health.main([]) == 2


def test_server_live_asks_only_health(monkeypatch):
    """--live: vLLM's /health answers 200 (the engine is alive), whatever the model list says; a 503 (the engine
    died) or no answer is unhealthy. It reads the port from the environment like readiness (a Kubernetes probe)."""
    with StubServer({("GET", "/health"): (200, {})}) as server:
        monkeypatch.setenv("GRPO_SERVER_PORT", str(server.port))
        assert health.main(["--role", "server", "--live"]) == 0
        assert [r[:2] for r in server.requests] == [("GET", "/health")]
    with StubServer({("GET", "/health"): (503, {})}) as server:
        assert health.main(["--role", "server", "--live", "--port", str(server.port)]) == 1
    assert health.main(["--role", "server", "--live", "--port", str(server.port), "--timeout", "1"]) == 1


def test_trainer_heartbeat(tmp_path, monkeypatch):
    path = tmp_path / "hb"
    monkeypatch.setenv("GRPO_HEARTBEAT_FILE", str(path))
    assert health.main(["--role", "trainer"]) == 1  # not started yet
    beat = health.Heartbeat(str(path), interval=0.05).start()
    time.sleep(0.2)  # start() wrote the first beat itself
    assert health.main(["--role", "trainer", "--max-age", "5"]) == 0
    old = time.time() - 600
    os.utime(path, (old, old))
    beat.stop()
    assert not path.exists()
    path.write_text("stale")
    os.utime(path, (old, old))
    assert health.main(["--role", "trainer", "--max-age", "60"]) == 1


@pytest.fixture
def gcs():
    """A real TCP listener where Ray's GCS would be; yields its host:port."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


@pytest.mark.parametrize("role", ["head", "worker"])
def test_ray_roles_are_healthy_while_the_gcs_answers(role, gcs, monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert health.main(["--role", role, "--ray-address", gcs]) == 0
    monkeypatch.setenv("RAY_ADDRESS", gcs)  # a worker joins the head there
    monkeypatch.setenv("GRPO_ROLE", role)
    assert health.main([]) == 0
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{_closed_port()}")
    assert health.main(["--timeout", "1"]) == 1


def test_ray_head_finds_the_cluster_ray_recorded(gcs, monkeypatch, tmp_path):
    """verl's main_ppo starts its own Ray (no RAY_ADDRESS): Ray records the GCS address in ray_current_cluster."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    record = tmp_path / "ray_current_cluster"
    assert health.ray_address(None, str(record)) is None
    assert health.ray_healthy(None)[0] is False
    record.write_text(gcs + "\n")
    assert health.ray_address(None, str(record)) == gcs
    assert health.ray_healthy(health.ray_address(None, str(record))) == (True, f"Ray GCS {gcs} answers")
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # Ray's "find it yourself" value: the record decides
    assert health.ray_address(None, str(record)) == gcs


def test_role_is_required(monkeypatch):
    monkeypatch.delenv("GRPO_ROLE", raising=False)
    assert health.main([]) == 2


def test_health_imports_only_the_standard_library():
    import subprocess
    import sys

    code = "import sys, grpo_deploy.runtime.health; print(sorted({'torch','yaml','transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_rays_record_is_read_bounded_never_through_a_fifo_or_link(tmp_path, monkeypatch):
    """A FIFO, a link or a huge file where Ray's cluster record belongs: no address, no hang, no traceback."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real = tmp_path / "real"
    real.write_text("10.0.0.1:6379")
    link = tmp_path / "link"
    link.symlink_to(real)
    huge = tmp_path / "huge"
    huge.write_text("1" * 10_000)
    start = time.monotonic()
    assert [health.ray_address(None, str(p)) for p in (fifo, link, huge)] == [None, None, None]
    assert time.monotonic() - start < 5
    assert health.ray_address(None, str(real)) == "10.0.0.1:6379"
