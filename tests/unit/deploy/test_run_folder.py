"""Tests of grpo_deploy.deploy.run_folder (`up`'s claim on its run folder): a local share read before anything, the
refusal in one line (the other run's engine, model and last step, the fix), and the claim through a one-off container
(here a connector that runs the container's command on a folder of the test: no Docker), --fresh moving aside."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from grpo_deploy.deploy import run_folder
from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.hosts.connect import Result
from grpo_deploy.runtime.storage import run_record as rr
from grpo_deploy.spec import loads, new_spec
from grpo_deploy.spec.resolve import resolve


def _res(share, engine="trl-async", name="r1", host="local", **lora):
    data = yaml.safe_load(new_spec.spec_text("cpu", engine, [] if host == "local" else [host], name))
    data["hosts"][0]["shared_dir"] = str(share)
    if lora:
        data.setdefault("overrides", {}) or data.update(overrides={})
        data["overrides"]["lora"] = lora
    return resolve(loads(yaml.safe_dump(data)))


def _holding(share, res, checkpoints=(), **change):
    run_dir = share / "runs" / res.spec.run.name
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in checkpoints:
        (run_dir / "checkpoints" / name).mkdir()
    rr.write_record(str(run_dir), {**run_folder.mine(res), **change})
    return run_dir


def test_a_local_share_holding_another_engines_run_is_refused_in_one_line(tmp_path):
    res = _res(tmp_path)
    _holding(tmp_path, res, ["global_step_20", "global_step_30"], engine="verl")
    with pytest.raises(LaunchError) as caught:
        run_folder.refuse_other_run(res)
    line = str(caught.value)
    assert "\n" not in line and "/shared/runs/r1" in line and f"this machine ({tmp_path}/runs/r1)" in line
    assert f"verl of {res.settings.model.path}" in line and "last checkpoint step 30" in line
    assert "engine verl, not trl-async" in line
    assert "another run.name" in line and "up --fresh" in line and "nothing was started" in line


def test_another_lora_rank_is_refused_and_the_same_run_passes(tmp_path):
    res = _res(tmp_path)
    _holding(tmp_path, res, ["checkpoint-20"])
    run_folder.refuse_other_run(res)
    with pytest.raises(LaunchError, match="lora.r 8, not 32"):
        run_folder.refuse_other_run(_res(tmp_path, r=32))


def test_no_folder_or_a_share_not_seen_from_here_is_left_to_the_claim(tmp_path):
    run_folder.refuse_other_run(_res(tmp_path))  # nothing there yet
    res = _res(tmp_path, host="gpu1")
    _holding(tmp_path, res, engine="verl")
    run_folder.refuse_other_run(res)  # a remote host's share: read there, by claim()


def test_a_folder_this_user_may_not_read_is_left_to_the_claim(tmp_path, monkeypatch):
    res = _res(tmp_path)
    _holding(tmp_path, res, engine="verl")
    monkeypatch.setattr(run_folder.os, "access", lambda path, mode: not path.endswith(rr.RECORD))
    run_folder.refuse_other_run(res)  # read in the container, as the run's user


def test_a_hostile_record_on_a_local_share_is_one_line(tmp_path):
    res = _res(tmp_path)
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    os.mkfifo(tmp_path / "runs" / "r1" / rr.RECORD)
    with pytest.raises(LaunchError) as caught:
        run_folder.refuse_other_run(res)
    assert "\n" not in str(caught.value) and "FIFO" in str(caught.value) and rr.RECORD in str(caught.value)


class _Here:
    """A connector whose `docker run` runs the command here, the share at *share* (no Docker)."""

    name, is_local = "local", True

    def __init__(self, share, mount="/shared"):
        self.share, self.mount, self.argv = str(share), mount, None

    def run(self, argv, timeout=None):
        self.argv = argv
        command = argv[argv.index("python3"):]
        command = [a.replace(self.mount + "/", self.share + "/") if not a.startswith("{") else a for a in command]
        p = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
        return Result(p.returncode, p.stdout.replace(self.share + "/", self.mount + "/"), p.stderr)


def test_claim_refuses_another_run_in_one_line_and_changes_nothing(tmp_path):
    res = _res(tmp_path)
    run_dir = _holding(tmp_path, res, ["global_step_30"], engine="verl", model="Qwen/Qwen3-8B")
    logged = []
    with pytest.raises(LaunchError) as caught:
        run_folder.claim(_Here(tmp_path), res, False, logged.append)
    line = str(caught.value)
    assert "\n" not in line and "verl of Qwen/Qwen3-8B, last checkpoint step 30" in line and "up --fresh" in line
    assert sorted(os.listdir(run_dir)) == ["checkpoints", rr.RECORD] and not logged


def test_claim_with_fresh_moves_the_folder_aside_and_says_where(tmp_path):
    res = _res(tmp_path)
    run_dir = _holding(tmp_path, res, ["global_step_30"], engine="verl")
    logged = []
    conn = _Here(tmp_path)
    run_folder.claim(conn, res, True, logged.append)
    assert "--fresh" in conn.argv and "--discard" not in conn.argv and "--rm" in conn.argv
    (line,) = logged
    assert line.startswith("--fresh: moved /shared/runs/r1 aside to /shared/runs/r1.before-")
    assert f"the share {tmp_path} (local)" in line
    aside = [p for p in os.listdir(tmp_path / "runs") if p != "r1"]
    assert len(aside) == 1 and os.listdir(tmp_path / "runs" / aside[0] / "checkpoints") == ["global_step_30"]
    assert rr.read_record(str(run_dir)) == run_folder.mine(res)


def test_claim_of_a_scratch_trial_removes_and_says_so(tmp_path):
    res = _res(tmp_path)
    _holding(tmp_path, res)
    logged = []
    run_folder.claim(_Here(tmp_path), res, True, logged.append, discard=True)
    assert os.listdir(tmp_path / "runs") == ["r1"] and "removed the trial folder" in logged[0]


def test_claim_says_a_corrupt_record_in_one_line(tmp_path):
    res = _res(tmp_path)
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / rr.RECORD).write_bytes(b"\x00" * 50000)
    with pytest.raises(LaunchError) as caught:
        run_folder.claim(_Here(tmp_path), res, False, print)
    assert "\n" not in str(caught.value) and "is more than 8192 bytes" in str(caught.value)


def test_claim_on_an_image_without_the_module_warns_and_fresh_is_refused():
    res = _res("/srv/share")

    class Old:
        name = "local"

        def run(self, argv, timeout=None):
            return Result(1, "", "/usr/bin/python3: No module named grpo_deploy.runtime.storage.run_record\n")

    logged = []
    run_folder.claim(Old(), res, False, logged.append)
    assert "was not checked" in logged[0]
    with pytest.raises(LaunchError, match="rebuild it"):
        run_folder.claim(Old(), res, True, logged.append)


def test_the_record_names_the_engine_model_and_lora_shape():
    mine = run_folder.mine(_res("/srv/share", engine="verl", name="v1"))
    assert json.loads(json.dumps(mine)) == rr.validate(mine, "x") and mine["engine"] == "verl"
    assert set(mine["lora"]) == {"r", "alpha", "target_modules"}
