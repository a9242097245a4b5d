"""Trainer entrypoint: spawn-safe imports, and the event bracketing of a run around a stand-in trainer."""

import subprocess
import sys
import types

import yaml

from grpo_deploy.common.metrics import MetricsSink, read_events
from grpo_deploy.runtime.trainer import train
from grpo_deploy.runtime.trainer.config import parse_config
from tests.unit.runtime.stub_server import StubServer


def test_importing_the_entrypoint_is_light():
    """TRL's spawned rollout child re-imports the main module; it must not pull in torch or TRL, or run anything."""
    code = ("import sys, grpo_deploy.runtime.trainer.train; "
            "print(sorted({'torch', 'trl', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class FakeTrainer:
    def __init__(self, steps=3, error=None):
        self.state = types.SimpleNamespace(global_step=0)
        self.steps, self.error, self.resumed = steps, error, "unset"

    def train(self, resume_from_checkpoint=None):
        self.resumed = resume_from_checkpoint
        self.state.global_step = self.steps
        if self.error:
            raise self.error


def config_for(tmp_path, server_url, **extra):
    raw = {
        "run_name": "t",
        "model": "/m",
        "metrics_path": str(tmp_path / "metrics.jsonl"),
        "async_grpo": {"output_dir": str(tmp_path / "out"), "vllm_server_base_url": server_url},
        **extra,
    }
    return parse_config(raw, "test.yaml")


ROUTES = {
    ("GET", "/v1/models"): (200, {"data": [{"id": "tiny"}, {"id": "trl-policy-v7"}]}),
    ("POST", "/v1/unload_lora_adapter"): (200, "ok"),
    ("POST", "/resume"): (200, "ok"),
}


def test_successful_run_events_in_order(tmp_path, monkeypatch):
    partial = tmp_path / "out" / "checkpoint-5"
    partial.mkdir(parents=True)
    fake = FakeTrainer(steps=3)
    monkeypatch.setattr(train, "build_trainer", lambda config, sink: (fake, "attention shim installed (test)"))
    with StubServer(ROUTES) as server, MetricsSink(str(tmp_path / "metrics.jsonl")) as sink:
        assert train.run(config_for(tmp_path, server.url), sink) == 0
    events = read_events(str(tmp_path / "metrics.jsonl"))
    names = [e["event"] for e in events]
    assert names == ["run_start", "checkpoint_quarantine", "adapter_unload_stale", "trainer_ready", "run_end"]
    start, quarantined, unloaded, ready, end = events
    assert start["run_name"] == "t" and start["resumed_from"] is None and set(start) >= {"uid", "gid", "umask", "pid"}
    assert quarantined["reason"].startswith("no trainer_state.json")
    assert unloaded["names"] == ["trl-policy-v7"] and ready["attention_shim"].startswith("attention shim")
    assert end == {**end, "status": "ok", "error": None, "steps": 3}
    assert ("POST", "/resume", None) not in server.requests
    assert fake.resumed is None


def test_failed_run_records_error_and_resumes_the_server(tmp_path, monkeypatch):
    fake = FakeTrainer(steps=2, error=RuntimeError("sync failed"))
    fake.vllm_client = types.SimpleNamespace(last_failure="POST /v1/load_lora_adapter trl-policy-v3 -> 404: No adapter")
    monkeypatch.setattr(train, "build_trainer", lambda config, sink: (fake, "shim"))
    with StubServer(ROUTES) as server, MetricsSink(str(tmp_path / "metrics.jsonl")) as sink:
        assert train.run(config_for(tmp_path, server.url, unload_stale_adapters=False), sink) == 1
    end = read_events(str(tmp_path / "metrics.jsonl"))[-1]
    assert end["event"] == "run_end" and end["status"] == "error" and end["steps"] == 2
    assert end["error"].startswith("RuntimeError: sync failed") and "No adapter" in end["error"]
    assert ("POST", "/resume", None) in server.requests
    assert not any(path == "/v1/unload_lora_adapter" for _, path, _ in server.requests)


def test_bad_resume_target_still_brackets_the_run(tmp_path):
    config = config_for(tmp_path, "http://127.0.0.1:9", resume=str(tmp_path / "nope"))
    with MetricsSink(str(tmp_path / "metrics.jsonl")) as sink:
        assert train.run(config, sink) == 1
    start, end = read_events(str(tmp_path / "metrics.jsonl"))
    assert (start["event"], end["event"], end["steps"]) == ("run_start", "run_end", 0)
    assert "no such directory" in end["error"]


def test_main_config_error_exits_2(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"run_name": "x"}))
    assert train.main(["--config", str(path)]) == 2
    assert "config error" in capsys.readouterr().err


def test_main_runs_with_heartbeat_and_umask(tmp_path, monkeypatch):
    import os

    seen = {}

    def fake_build(config, sink):
        seen["heartbeat"] = os.path.exists(tmp_path / "hb")
        seen["umask"] = os.umask(0o022)
        os.umask(seen["umask"])
        return FakeTrainer(1), "shim"

    monkeypatch.setattr(train, "build_trainer", fake_build)
    monkeypatch.setenv("GRPO_UMASK", "0027")
    monkeypatch.setenv("GRPO_HEARTBEAT_FILE", str(tmp_path / "hb"))
    path = tmp_path / "c.yaml"
    raw = {
        "run_name": "x",
        "model": "/m",
        "metrics_path": str(tmp_path / "m.jsonl"),
        "unload_stale_adapters": False,
        "async_grpo": {"output_dir": str(tmp_path / "out")},
    }
    path.write_text(yaml.safe_dump(raw))
    previous = os.umask(0o022)
    try:
        assert train.main(["--config", str(path)]) == 0
    finally:
        os.umask(previous)
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert seen == {"heartbeat": True, "umask": 0o027}
    assert not (tmp_path / "hb").exists()
    assert [e["event"] for e in read_events(str(tmp_path / "m.jsonl"))] == ["run_start", "trainer_ready", "run_end"]


def test_sigterm_is_recorded_as_error(tmp_path, monkeypatch):
    stopped = FakeTrainer(4, error=train.Terminated("terminated by signal 15"))
    monkeypatch.setattr(train, "build_trainer", lambda config, sink: (stopped, "shim"))
    with MetricsSink(str(tmp_path / "m.jsonl")) as sink:
        assert train.run(config_for(tmp_path, "http://127.0.0.1:9", unload_stale_adapters=False), sink) == 1
    end = read_events(str(tmp_path / "m.jsonl"))[-1]
    assert end["status"] == "error" and "signal 15" in end["error"] and end["steps"] == 4


def test_a_read_only_share_stops_the_run_with_the_storage_fault(tmp_path, monkeypatch):
    """An EROFS under the checkpoint directory (here raised by the stand-in trainer) becomes a storage_fault event
    and the run_end error, both naming the path, the uid and the newest complete checkpoint."""
    done = tmp_path / "out" / "checkpoint-4"
    done.mkdir(parents=True)
    (done / "trainer_state.json").write_text("{}")
    monkeypatch.setattr(train.checkpoints, "incomplete_reason", lambda path: None)
    path = str(tmp_path / "out" / ".vllm_lora" / ".trl-policy-v7.tmp")
    fake = FakeTrainer(steps=6, error=OSError(30, "Read-only file system", path))
    monkeypatch.setattr(train, "build_trainer", lambda config, sink: (fake, "shim"))
    with StubServer(ROUTES) as server, MetricsSink(str(tmp_path / "metrics.jsonl")) as sink:
        assert train.run(config_for(tmp_path, server.url, unload_stale_adapters=False, resume="never"), sink) == 1
    *_, fault, end = read_events(str(tmp_path / "metrics.jsonl"))
    assert fault["event"] == "storage_fault" and fault["kind"] == "read-only" and fault["path"] == str(tmp_path / "out")
    assert "writing .vllm_lora/.trl-policy-v7.tmp" in fault["message"]
    assert fault["step"] == 6 and f"checkpoint {done} is kept" in fault["message"]
    assert end["status"] == "storage-fault" and end["error"] == fault["message"]
    assert ("POST", "/resume", None) in server.requests
