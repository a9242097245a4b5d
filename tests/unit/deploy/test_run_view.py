"""Tests of grpo_deploy.deploy.run_view: a run's events as the deployer and status read them (the deployer's events
plus the trainer's saved copy, limited to the latest `up`), on this machine's connector."""

from __future__ import annotations

import json

from grpo_deploy.deploy import run_view
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.hosts.connect import SshOptions
from grpo_deploy.spec import new_spec, resolve


def test_deployer_events_use_the_runtime_envelope(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dep = Deployment(resolve.resolve(new_spec.embedded_default()), SshOptions())
    state = dep.state
    state.emit("up_start", run="rehearsal", seconds=float("nan"))
    (line,) = state.deploy_log.read_text().splitlines()
    record = json.loads(line)
    assert list(record)[:2] == ["event", "time"] and record["event"] == "up_start"
    assert record["run"] == "rehearsal" and record["seconds"] is None  # NaN is written as null, never as NaN
    assert [e["event"] for e in run_view.run_events(dep)] == ["up_start"]


def test_run_events_add_the_trainer_s_saved_metrics_after_the_latest_up(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dep = Deployment(resolve.resolve(new_spec.embedded_default()), SshOptions())
    assert run_view.run_events(dep) == []
    dep.state.emit("up_start", run="rehearsal")
    start = dep.state.deploy_events()[0]["time"]
    dep.state.metrics_copy.write_text(json.dumps({"event": "step", "time": start - 100, "step": 1}) + "\n"
                                      + json.dumps({"event": "step", "time": start + 1, "step": 2}) + "\n")
    assert [(e["event"], e.get("step")) for e in run_view.run_events(dep)] == [("up_start", None), ("step", 2)]
    dep.close()


def test_log_text_strips_control_characters_and_escapes_unless_raw():
    line = "trainer-1  | \x1b[32mstep 3\x1b[0m\x1b]0;title\x07 done\r"
    assert run_view.log_text(line) == "trainer-1  | step 3 done"
    assert run_view.log_text(line, raw=True) == line
