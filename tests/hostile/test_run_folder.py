"""`grpo-deploy up` on a run folder that holds another run, or a hostile run record, on a share in a folder of this
machine (hosts[].shared_dir): the real CLI in a subprocess, refused before anything is built, started or written —
one line naming the folder (the record file when it is the record), what was wrong and the fix, exit 2."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from grpo_deploy.runtime.storage import run_record as rr
from grpo_deploy.spec import new_spec
from tests.clirun import run_cli


def _tree(root):
    return sorted((str(p.relative_to(root)), p.is_dir()) for p in root.rglob("*"))


def _spec(tmp_path, engine="trl-async", **lora):
    share = tmp_path / "share"
    share.mkdir(exist_ok=True)
    data = yaml.safe_load(new_spec.spec_text("cpu", engine, []))
    data["hosts"][0]["shared_dir"] = str(share)
    if lora:
        data["overrides"] = {"lora": lora}
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "spec.yaml").write_text(yaml.safe_dump(data))
    return work, share / "runs" / data["run"]["name"]


def _record(run_dir, **change):
    base = rr.record_for(run_dir.name, "trl-async", "/opt/grpo-deploy/models/tiny-qwen2", 8, 16, "all-linear")
    (run_dir / "checkpoints").mkdir(parents=True)
    rr.write_record(str(run_dir), {**base, **change})


def _refused(work, share_root):
    before = _tree(share_root), _tree(work)
    proc = run_cli("up", "-f", "spec.yaml", cwd=work, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert (_tree(share_root), _tree(work)) == before  # nothing written, moved or deleted; no state folder either
    return proc.stderr


def test_up_refuses_a_folder_holding_the_other_engines_run(tmp_path):
    work, run_dir = _spec(tmp_path)  # the trl-async rehearsal's folder, where a verl run left its steps
    _record(run_dir, engine="verl")
    (run_dir / "checkpoints" / "global_step_20").mkdir()
    (run_dir / "checkpoints" / "global_step_30").mkdir()
    line = _refused(work, tmp_path / "share")
    assert "/shared/runs/rehearsal" in line and "verl of /opt/grpo-deploy/models/tiny-qwen2" in line
    assert "last checkpoint step 30" in line and "another run.name" in line and "up --fresh" in line


def test_up_refuses_a_folder_of_another_lora_rank(tmp_path):
    work, run_dir = _spec(tmp_path, r=16)
    _record(run_dir)
    assert "lora.r 8, not 16" in _refused(work, tmp_path / "share")


def test_up_refuses_an_old_folder_of_the_other_engines_checkpoints(tmp_path):
    work, run_dir = _spec(tmp_path)
    (run_dir / "checkpoints" / "global_step_30").mkdir(parents=True)
    assert "engine verl, not trl-async" in _refused(work, tmp_path / "share")


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: p.write_bytes(b"x" * 100000), "is more than 8192 bytes"),
    (lambda p: p.write_text("{not json"), "is not JSON"),
    (lambda p: p.write_text(json.dumps({"version": 1, "engine": "verl"})), "key lora must be an object"),
    (lambda p: os.mkfifo(p), "FIFO"),
    (lambda p: p.symlink_to("/dev/zero"), "symbolic link"),
])
def test_up_answers_a_hostile_record_in_one_line(tmp_path, make, words):
    work, run_dir = _spec(tmp_path)
    run_dir.mkdir(parents=True)
    make(run_dir / rr.RECORD)
    line = _refused(work, tmp_path / "share")
    assert words in line and rr.RECORD in line


def test_the_verl_rehearsal_has_a_run_name_of_its_own():
    names = {e: yaml.safe_load(new_spec.spec_text("cpu", e, []))["run"]["name"] for e in ("trl-async", "verl")}
    assert names == {"trl-async": "rehearsal", "verl": "verl-rehearsal"}
