"""Tests of grpo_deploy.deploy.run_state: the run's local folder (its render, the deployer's events, the metrics copy),
the saved events limited to the latest `up`, and the lock that lets one `up` of a run start at a time."""

from __future__ import annotations

import os

import pytest

from grpo_deploy import spec
from grpo_deploy.deploy.run_state import LaunchError, RunState, require_kit
from grpo_deploy.spec import resolve
from tests.specs import spec_yaml


def _state(tmp_path, name: str = "rehearsal") -> RunState:
    res = resolve.resolve(spec.loads(spec_yaml("cpu", "trl-async", (), **{"run.name": name}), source="s.yaml"))
    return RunState(res, root=tmp_path / ".grpo-deploy")


def test_the_run_folder_holds_the_render_the_deploy_log_and_the_metrics_copy(tmp_path):
    state = _state(tmp_path)
    assert state.dir == (tmp_path / ".grpo-deploy" / "rehearsal").resolve()
    assert state.render_dir.parent == state.dir and state.deploy_log.parent == state.dir
    assert state.metrics_copy.parent == state.dir
    assert state.deploy_events() == []


def test_saved_events_start_at_the_latest_up(tmp_path):
    state = _state(tmp_path)
    state.emit("up_start", run="rehearsal")
    state.emit("up_end", status="failed")
    state.emit("up_start", run="rehearsal")
    assert [e["event"] for e in state.deploy_events()] == ["up_start", "up_end", "up_start"]
    saved = state.saved_events()
    assert [e["event"] for e in saved] == ["up_start"] and saved[0]["time"] >= state.deploy_events()[1]["time"]


def test_a_second_up_lock_of_the_run_is_refused_naming_the_holder(tmp_path):
    state = _state(tmp_path, f"lock-test-{os.getpid()}")
    with state.up_lock():
        with pytest.raises(LaunchError, match=r"already being started from this folder \(`grpo-deploy up` in "):
            with state.up_lock():
                pass
    with state.up_lock():  # released: the next one may go
        pass


def test_the_kit_s_folders_are_found():
    assert set(require_kit()) and all(path.is_dir() for path in require_kit().values())


def test_the_run_s_token_is_made_once_kept_0600_and_replaced_when_not_the_kit_s(tmp_path, capsys):
    from grpo_deploy.runtime import run_token

    state = _state(tmp_path)
    token = state.token()
    assert run_token.well_formed(token) and state.token() == token == _state(tmp_path).token()  # a second `up`
    assert os.stat(state.token_file).st_mode & 0o777 == 0o600
    assert _state(tmp_path, "other").token() != token  # one per run
    for spoil in (lambda p: p.chmod(0o644), lambda p: p.write_text("not a token\n"),
                  lambda p: (p.unlink(), p.symlink_to(tmp_path / "elsewhere"))):
        spoil(state.token_file)
        new = state.token()
        assert new != token and run_token.well_formed(new) and not state.token_file.is_symlink()
        assert os.stat(state.token_file).st_mode & 0o777 == 0o600
        err = capsys.readouterr().err
        assert "replaced by a new one" in err and err.count("\n") == 1 and "not a token" not in err
        token = new
