"""Resume selection (runtime/storage/resume.py) in TRL's layout: the newest complete checkpoint, half-written ones
quarantined (never over an earlier quarantine), an explicit path validated and never moved, and a resume refused when
the LoRA shape or the world size changed. verl's layout across a resume: test_checkpoints_verl.py."""

import json
import os

import pytest

from grpo_deploy.runtime.storage import checkpoints
from grpo_deploy.runtime.storage.resume import ResumeError, resolve_resume
from tests.unit.runtime.storage.test_checkpoints import trl_checkpoint


def make(output_dir, step, complete=True, state_text=None):
    path = output_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"x")
    if complete:
        (path / "trainer_state.json").write_text(state_text or json.dumps({"global_step": step}))
    return str(path)


def test_auto_takes_newest_complete_and_quarantines_partials(tmp_path):
    make(tmp_path, 10)
    newest = make(tmp_path, 20)
    make(tmp_path, 30, complete=False)
    make(tmp_path, 40, state_text="{truncated")
    chosen, moved = resolve_resume(str(tmp_path), "auto")
    assert chosen == newest
    reasons = [(os.path.basename(m.path), m.reason.split()[0]) for m in moved]
    assert reasons == [("checkpoint-30", "no"), ("checkpoint-40", "unreadable")]
    assert sorted(os.listdir(tmp_path / "quarantine")) == ["checkpoint-30", "checkpoint-40"]
    assert not (tmp_path / "checkpoint-30").exists()


def test_auto_numeric_order_and_empty_dir(tmp_path):
    assert resolve_resume(str(tmp_path / "absent"), "auto") == (None, [])
    make(tmp_path, 9)
    newest = make(tmp_path, 10)
    assert resolve_resume(str(tmp_path), "auto")[0] == newest


def test_quarantine_never_overwrites(tmp_path):
    make(tmp_path, 5, complete=False)
    resolve_resume(str(tmp_path), "auto")
    make(tmp_path, 5, complete=False)
    _, moved = resolve_resume(str(tmp_path), "auto")
    assert moved[0].moved_to != str(tmp_path / "quarantine" / "checkpoint-5")
    assert len(os.listdir(tmp_path / "quarantine")) == 2


def test_never_touches_nothing(tmp_path):
    make(tmp_path, 5, complete=False)
    assert resolve_resume(str(tmp_path), "never") == (None, [])
    assert (tmp_path / "checkpoint-5").exists()


def test_explicit_path_must_be_complete(tmp_path):
    good = make(tmp_path, 1)
    assert resolve_resume(str(tmp_path), good) == (good, [])
    partial = make(tmp_path, 2, complete=False)
    with pytest.raises(ResumeError, match="half-written"):
        resolve_resume(str(tmp_path), partial)
    assert os.path.exists(partial)  # an explicit target is reported, not moved


def test_resume_refused_when_the_lora_shape_or_world_size_changed(tmp_path):
    trl_checkpoint(tmp_path, 10, r=4)
    same = checkpoints.Shape(lora_r=4, target_modules=("q_proj", "v_proj"), world_size=1)
    assert resolve_resume(str(tmp_path), "auto", expect=same)[0].endswith("checkpoint-10")
    for other, words in ((checkpoints.Shape(lora_r=8, world_size=1), "lora_r 4 in the checkpoint, 8 in this run"),
                         (checkpoints.Shape(lora_r=4, world_size=2), "world_size 1 in the checkpoint, 2 in this run"),
                         (checkpoints.Shape(target_modules=("q_proj",)), "target_modules")):
        with pytest.raises(ResumeError, match=words):
            resolve_resume(str(tmp_path), "auto", expect=other)
    assert (tmp_path / "checkpoint-10").exists()  # a refusal moves nothing
