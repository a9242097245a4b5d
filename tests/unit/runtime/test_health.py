"""Health command: server readiness from /v1/models, trainer liveness from its heartbeat file."""

import os
import time

from grpo_deploy.runtime import health

from .stub_server import StubServer

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


def test_trainer_heartbeat(tmp_path, monkeypatch):
    path = tmp_path / "hb"
    monkeypatch.setenv("GRPO_HEARTBEAT_FILE", str(path))
    assert health.main(["--role", "trainer"]) == 1  # not started yet
    beat = health.Heartbeat(str(path), interval=0.05).start()
    time.sleep(0.2)
    assert health.main(["--role", "trainer", "--max-age", "5"]) == 0
    old = time.time() - 600
    os.utime(path, (old, old))
    beat.stop()
    assert not path.exists()
    path.write_text("stale")
    os.utime(path, (old, old))
    assert health.main(["--role", "trainer", "--max-age", "60"]) == 1


def test_role_is_required(monkeypatch):
    monkeypatch.delenv("GRPO_ROLE", raising=False)
    assert health.main([]) == 2


def test_health_imports_only_the_standard_library():
    import subprocess
    import sys

    code = "import sys, grpo_deploy.runtime.health; print(sorted({'torch','yaml','transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
