"""verl checkpoints across a resume, over real directory trees shaped as verl 0.9.1 writes them (global_step_N/actor/
shards per rank, fsdp_config.json, lora_train_meta.json, data.pt, latest_checkpointed_iteration.txt written last):
the tracker decides what resumes, a save cut short is quarantined before the restart, and retention is still
enforced after the resume — verl's own `max_actor_ckpt_to_keep` only knows the saves of the process that made them."""

import json
import os

import pytest

from grpo_deploy.runtime.storage import checkpoints
from grpo_deploy.runtime.storage.checkpoints import Shape, TrackerUnreadable, prune
from grpo_deploy.runtime.storage.resume import ResumeError, resolve_resume, verl_resume
from tests.unit.runtime.storage.test_checkpoints import verl_checkpoint

TRACKER = "latest_checkpointed_iteration.txt"


def verl_save(root, step, world=2, r=8):
    """One complete verl save: the shards, data.pt, then the tracker (the order verl's driver follows)."""
    path = verl_checkpoint(root, step, world=world, r=r)
    (root / TRACKER).write_text(str(step))
    return path


def verl_retention(root, step):
    """What verl's own retention does to an old step: removes global_step_N/actor only, data.pt stays."""
    for name in os.listdir(root / f"global_step_{step}" / "actor"):
        os.remove(root / f"global_step_{step}" / "actor" / name)
    os.rmdir(root / f"global_step_{step}" / "actor")


def crashed_save(root, step, world=2):
    """A save the disk filled under (the seed's step 80): some rank shards written, no data.pt, tracker untouched."""
    return verl_checkpoint(root, step, world=world, data=False,
                           missing=(f"optim_world_size_{world}_rank_1.pt", f"extra_state_world_size_{world}_rank_1.pt"))


def states(root):
    return [(c.step, c.state) for c in checkpoints.list_checkpoints(str(root), "verl")]


def first_process(root):
    """Process 1, max_actor_ckpt_to_keep=2: saves 20, 40, 60 (verl removed 20's actor/), then dies saving 80."""
    for step in (20, 40, 60):
        verl_save(root, step)
    verl_retention(root, 20)
    crashed_save(root, 80)


def test_resume_takes_the_tracker_step_and_quarantines_the_save_cut_short(tmp_path):
    first_process(tmp_path)
    assert states(tmp_path) == [(20, "pruned"), (40, "complete"), (60, "complete"), (80, "half-written")]
    chosen, moved = verl_resume(str(tmp_path), expect=Shape(lora_r=8, world_size=2))
    assert chosen == str(tmp_path / "global_step_60")
    assert [(os.path.basename(m.path), "newer than the tracker" in m.reason) for m in moved] == \
        [("global_step_80", True)]
    assert os.listdir(tmp_path / "quarantine") == ["global_step_80"] and not (tmp_path / "global_step_80").exists()
    assert resolve_resume(str(tmp_path), "auto", layout="verl")[0] == chosen  # the same via the dispatcher


def test_retention_is_enforced_after_the_resume(tmp_path):
    first_process(tmp_path)
    verl_resume(str(tmp_path))
    for step in (80, 100):  # process 2 resumed from 60: verl's retention list holds only [80, 100]
        verl_save(tmp_path, step)
    assert states(tmp_path) == [(20, "pruned"), (40, "complete"), (60, "complete"), (80, "complete"),
                                (100, "complete")]  # four complete on disk where keep is 2
    result = prune(str(tmp_path), keep=2, layout="verl")
    assert [c.step for c in result.removed] == [40, 60] and [c.step for c in result.kept] == [80, 100]
    assert states(tmp_path) == [(20, "pruned"), (80, "complete"), (100, "complete")]
    assert os.listdir(tmp_path / "quarantine") == ["global_step_80"]  # the dead save is still kept, not deleted
    assert (tmp_path / TRACKER).read_text() == "100"
    assert prune(str(tmp_path), keep=2, layout="verl").removed == []  # idempotent


def test_pruning_waits_for_a_newer_complete_save(tmp_path):
    """A save in progress (its step newer than the tracker) neither counts as the newer checkpoint nor is moved
    when the prune runs beside the trainer (leave_partial); only once the tracker names it does the oldest go."""
    verl_save(tmp_path, 20)
    verl_save(tmp_path, 40)
    crashed_save(tmp_path, 60)  # being written: the tracker still says 40
    during = prune(str(tmp_path), keep=2, layout="verl", leave_partial=True)
    assert during.removed == [] and during.quarantined == [] and (tmp_path / "global_step_60").exists()
    assert (tmp_path / "global_step_20" / "actor").is_dir()
    for name in ("optim_world_size_2_rank_1.pt", "extra_state_world_size_2_rank_1.pt"):
        (tmp_path / "global_step_60" / "actor" / name).write_bytes(b"x" * 100)
    (tmp_path / "global_step_60" / "data.pt").write_bytes(b"d")
    (tmp_path / TRACKER).write_text("60")  # the save completed
    after = prune(str(tmp_path), keep=2, layout="verl", leave_partial=True)
    assert [c.step for c in after.removed] == [20] and [c.step for c in after.kept] == [40, 60]


def test_keep_one_never_removes_the_only_complete_checkpoint(tmp_path):
    """verl once deleted the old checkpoint before writing the new one (PR #4873): with keep 1 and the new save cut
    short, the old one must survive."""
    verl_save(tmp_path, 20)
    crashed_save(tmp_path, 40)
    result = prune(str(tmp_path), keep=1, layout="verl")
    assert result.removed == [] and [c.step for c in result.kept] == [20]
    assert states(tmp_path) == [(20, "complete")] and os.listdir(tmp_path / "quarantine") == ["global_step_40"]


def test_an_unreadable_tracker_stops_prune_and_resume_without_touching_anything(tmp_path, capsys):
    verl_save(tmp_path, 20)
    verl_save(tmp_path, 40)
    (tmp_path / TRACKER).write_text("")  # verl's tracker write was interrupted
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(TrackerUnreadable, match="nothing was moved or removed"):
        prune(str(tmp_path), keep=1, layout="verl")
    with pytest.raises(TrackerUnreadable):
        verl_resume(str(tmp_path))
    assert checkpoints._main(["prune", str(tmp_path), "--keep", "1", "--layout", "verl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("prune: ") and TRACKER in err[0]
    assert sorted(os.listdir(tmp_path)) == before and not (tmp_path / "quarantine").exists()


def test_resume_refused_when_the_tracker_names_a_missing_or_incomplete_step(tmp_path):
    verl_save(tmp_path, 20)
    (tmp_path / TRACKER).write_text("40")  # no global_step_40: verl would silently train from scratch
    with pytest.raises(ResumeError, match="names step 40, whose checkpoint does not exist"):
        verl_resume(str(tmp_path))
    crashed_save(tmp_path, 40)
    with pytest.raises(ResumeError, match="names step 40, whose checkpoint is half-written: missing shards"):
        verl_resume(str(tmp_path))
    assert (tmp_path / "global_step_40").exists()  # a refusal moves nothing


def test_resume_refused_when_the_world_size_or_rank_changed(tmp_path):
    verl_save(tmp_path, 20, world=4, r=64)
    for expect, words in ((Shape(world_size=2), "world_size 4 in the checkpoint, 2 in this run"),
                          (Shape(lora_r=32), "lora_r 64 in the checkpoint, 32 in this run")):
        with pytest.raises(ResumeError, match=words):
            verl_resume(str(tmp_path), expect=expect)
    assert verl_resume(str(tmp_path), expect=Shape(lora_r=64, world_size=4))[0].endswith("global_step_20")


def test_explicit_resume_path_must_be_complete(tmp_path):
    good = verl_save(tmp_path, 20)
    crashed_save(tmp_path, 40)
    assert verl_resume(str(tmp_path), str(good)) == (str(good), [])
    with pytest.raises(ResumeError, match="newer than the tracker"):
        verl_resume(str(tmp_path), str(tmp_path / "global_step_40"))
    with pytest.raises(ResumeError, match="no such"):
        verl_resume(str(tmp_path), str(tmp_path / "global_step_60"))


def test_fresh_directory_resumes_nothing(tmp_path):
    assert verl_resume(str(tmp_path / "absent")) == (None, [])
    assert verl_resume(str(tmp_path)) == (None, [])
    assert json.loads(json.dumps(states(tmp_path))) == []
