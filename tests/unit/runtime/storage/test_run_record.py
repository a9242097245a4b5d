"""Tests of grpo_deploy.runtime.storage.run_record (what run a run folder holds): the record written and read back,
the decision (same run, another engine, model or LoRA shape refused, an old folder without a record judged by its
checkpoint names), --fresh moving the old folder aside whole, and hostile records answered in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grpo_deploy.runtime.storage import run_record as rr

TRL = rr.record_for("rehearsal", "trl-async", "Qwen/Qwen2.5-0.5B-Instruct", 8, 16, "all-linear")


def _folder(tmp_path, record: dict | None = None, checkpoints=()):
    run_dir = tmp_path / "runs" / "rehearsal"
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in checkpoints:
        (run_dir / "checkpoints" / name).mkdir()
    if record is not None:
        rr.write_record(str(run_dir), record)
    return str(run_dir), str(run_dir / "checkpoints")


def test_the_record_is_written_atomically_and_read_back(tmp_path):
    run_dir, _ = _folder(tmp_path, TRL)
    assert rr.read_record(run_dir) == TRL
    assert sorted(os.listdir(run_dir)) == ["checkpoints", rr.RECORD]  # no temporary file left behind


def test_the_same_run_is_claimed_and_its_record_left_as_it_is(tmp_path):
    run_dir, ckpt = _folder(tmp_path, TRL, ["checkpoint-20"])
    before = os.stat(os.path.join(run_dir, rr.RECORD)).st_mtime_ns
    answer = rr.claim(run_dir, ckpt, TRL)
    assert answer["ok"] and answer["moved_to"] is None and answer["note"] is None
    assert os.stat(os.path.join(run_dir, rr.RECORD)).st_mtime_ns == before


def test_a_new_folder_is_claimed_and_recorded(tmp_path):
    run_dir = str(tmp_path / "runs" / "new")
    assert rr.claim(run_dir, f"{run_dir}/checkpoints", TRL)["ok"]
    assert rr.read_record(run_dir) == TRL


@pytest.mark.parametrize(("change", "words"), [
    ({"engine": "verl"}, "engine verl, not trl-async"),
    ({"model": "Qwen/Qwen3-8B"}, "model Qwen/Qwen3-8B, not Qwen/Qwen2.5-0.5B-Instruct"),
    ({"lora": {"r": 32, "alpha": 16, "target_modules": "all-linear"}}, "lora.r 32, not 8"),
    ({"lora": {"r": 8, "alpha": 64, "target_modules": "all-linear"}}, "lora.alpha 64, not 16"),
    ({"lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}},
     "lora.target_modules q_proj,v_proj, not all-linear"),
])
def test_another_run_is_refused_with_what_differs_and_nothing_changes(tmp_path, change, words):
    run_dir, ckpt = _folder(tmp_path, {**TRL, **change}, ["global_step_20", "global_step_30"])
    before = sorted(os.listdir(run_dir)), open(os.path.join(run_dir, rr.RECORD)).read()
    answer = rr.claim(run_dir, ckpt, TRL)
    assert not answer["ok"] and answer["differences"] == [words] and answer["found"]["last_step"] == 30
    assert (sorted(os.listdir(run_dir)), open(os.path.join(run_dir, rr.RECORD)).read()) == before


def test_an_old_folder_without_a_record_is_judged_by_its_checkpoint_names(tmp_path):
    run_dir, ckpt = _folder(tmp_path, None, ["checkpoint-20", "checkpoint-40"])
    found = rr.holder(run_dir, ckpt)
    assert found["engine"] == "trl-async" and found["record"] is False and found["last_step"] == 40
    verl = rr.record_for("rehearsal", "verl", TRL["model"], 8, 16, "all-linear")
    refused = rr.claim(run_dir, ckpt, verl)
    assert not refused["ok"] and refused["differences"] == ["engine trl-async, not verl"]
    taken = rr.claim(run_dir, ckpt, TRL)  # the same engine: taken as this run's, with a note, and recorded
    assert taken["ok"] and "holds no run record" in taken["note"] and rr.read_record(run_dir) == TRL


def test_an_old_folder_with_both_engines_checkpoints_is_refused_to_either(tmp_path):
    run_dir, ckpt = _folder(tmp_path, None, ["checkpoint-40", "global_step_30"])
    assert rr.claim(run_dir, ckpt, TRL)["differences"] == ["engine trl-async+verl, not trl-async"]


def test_an_old_folder_with_only_verls_tracker_is_verls_without_a_step(tmp_path):
    run_dir, ckpt = _folder(tmp_path)
    (tmp_path / "runs" / "rehearsal" / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("5")
    found = rr.holder(run_dir, ckpt)
    assert found["engine"] == "verl" and found["last_step"] is None


def test_a_folder_with_only_preflights_probe_is_a_new_one(tmp_path):
    run_dir = tmp_path / "runs" / "rehearsal"
    (run_dir / rr.PROBE).mkdir(parents=True)
    assert rr.holder(str(run_dir), None) is None
    assert rr.claim(str(run_dir), None, TRL)["note"] is None and rr.read_record(str(run_dir)) == TRL


def test_an_empty_old_folder_is_taken_with_a_note(tmp_path):
    run_dir, ckpt = _folder(tmp_path)
    answer = rr.claim(run_dir, ckpt, TRL)
    assert answer["ok"] and "holds no run record" in answer["note"]


def test_fresh_moves_the_old_folder_aside_whole_and_never_deletes(tmp_path):
    run_dir, ckpt = _folder(tmp_path, {**TRL, "engine": "verl"}, ["global_step_20"])
    (tmp_path / "runs" / "rehearsal" / "metrics.jsonl").write_text('{"event": "step"}\n')
    first = rr.claim(run_dir, ckpt, TRL, fresh=True)
    assert first["ok"] and first["moved_to"].startswith(f"{run_dir}{rr.ASIDE}")
    assert os.path.dirname(first["moved_to"]) == os.path.dirname(run_dir)  # beside it: the same filesystem
    assert sorted(os.listdir(first["moved_to"])) == ["checkpoints", "metrics.jsonl", rr.RECORD]
    assert os.listdir(os.path.join(first["moved_to"], "checkpoints")) == ["global_step_20"]
    assert sorted(os.listdir(run_dir)) == [rr.RECORD] and rr.read_record(run_dir) == TRL
    second = rr.claim(run_dir, ckpt, TRL, fresh=True)  # twice within a second: a name of its own, nothing replaced
    assert second["moved_to"] != first["moved_to"] and os.path.isdir(first["moved_to"])
    assert len(os.listdir(tmp_path / "runs")) == 3


def test_fresh_on_a_scratch_run_removes_the_old_folder(tmp_path):
    run_dir, ckpt = _folder(tmp_path, TRL, ["checkpoint-5"])
    answer = rr.claim(run_dir, ckpt, TRL, fresh=True, discard=True)
    assert answer["removed"] and answer["moved_to"] is None and os.listdir(tmp_path / "runs") == ["rehearsal"]


def test_aside_path_is_utc_and_next_to_the_folder():
    assert rr.aside_path("/no/such/runs/r1/", now=0) == "/no/such/runs/r1.before-19700101T000000Z"


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: p.write_bytes(b"{" * 20000), "is more than 8192 bytes"),
    (lambda p: p.write_bytes(b"not json"), "is not JSON"),
    (lambda p: p.write_bytes(b"\xff\xfe"), "is not JSON"),
    (lambda p: p.write_text("[1, 2]"), "is not a JSON object"),
    (lambda p: p.write_text(json.dumps({**TRL, "version": 9})), "key version must be 1"),
    (lambda p: p.write_text(json.dumps({**TRL, "engine": "x\ny"})), "key engine must be a printable string"),
    (lambda p: p.write_text(json.dumps({**TRL, "model": ""})), "key model must be"),
    (lambda p: p.write_text(json.dumps({**TRL, "lora": {**TRL["lora"], "r": True}})), "key lora.r must be"),
    (lambda p: p.write_text(json.dumps({**TRL, "lora": {**TRL["lora"], "r": -1}})), "key lora.r must be"),
    (lambda p: p.write_text(json.dumps({**TRL, "lora": [1]})), "key lora must be an object"),
    (lambda p: p.write_text(json.dumps({**TRL, "lora": {**TRL["lora"], "target_modules": ["q"] * 300}})),
     "more than 256"),
    (lambda p: p.write_text("[" * 100000 + "]" * 100000), "is more than 8192 bytes"),
    (lambda p: os.mkfifo(p), "FIFO"),
    (lambda p: p.mkdir(), "directory"),
    (lambda p: p.symlink_to("/etc/passwd"), "symbolic link"),
])
def test_a_hostile_record_is_one_line_naming_the_file_and_the_fix(tmp_path, make, words):
    run_dir, ckpt = _folder(tmp_path)
    make(tmp_path / "runs" / "rehearsal" / rr.RECORD)
    with pytest.raises(rr.RecordError) as caught:
        rr.claim(run_dir, ckpt, TRL)
    line = str(caught.value)
    assert "\n" not in line and words in line and rr.RECORD in line
    assert "run.name" in line or "pass the file" in line


def test_a_run_folder_that_is_a_link_is_refused_and_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "rehearsal").symlink_to(elsewhere)
    with pytest.raises(rr.RecordError, match="symbolic link"):
        rr.claim(str(tmp_path / "runs" / "rehearsal"), None, TRL)
    assert os.listdir(elsewhere) == []


def test_a_checkpoint_folder_that_is_a_link_is_not_listed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "global_step_9").mkdir(parents=True)
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "checkpoints").symlink_to(elsewhere)
    assert rr.checkpoint_steps(str(tmp_path / "runs" / "r" / "checkpoints")) == {"trl": [], "verl": []}


def _module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_deploy.runtime.storage.run_record", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_module_answers_json_and_refuses_in_one_stderr_line(tmp_path):
    run_dir, ckpt = _folder(tmp_path, {**TRL, "engine": "verl"}, ["global_step_30"])
    refused = _module("claim", run_dir, "--checkpoints", ckpt, "--record", json.dumps(TRL))
    answer = json.loads(refused.stdout)
    assert refused.returncode == 3 and answer["found"]["engine"] == "verl" and answer["found"]["last_step"] == 30
    (tmp_path / "runs" / "rehearsal" / rr.RECORD).write_text("garbage")
    bad = _module("claim", run_dir, "--checkpoints", ckpt, "--record", json.dumps(TRL))
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("claim: ") and "is not JSON" in bad.stderr and "Traceback" not in bad.stderr
    moved = _module("claim", run_dir, "--checkpoints", ckpt, "--record", json.dumps(TRL), "--fresh")
    assert moved.returncode == 0 and json.loads(moved.stdout)["moved_to"].startswith(run_dir + rr.ASIDE)
