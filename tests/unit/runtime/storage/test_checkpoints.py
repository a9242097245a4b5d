"""The checkpoint manager (runtime/storage/checkpoints.py) on both layouts: list, sizes, states and shapes, what
is complete (verl's tracker, every rank of a sharded TRL save), prune and quarantine, and the command line. Resume
selection: test_resume.py; verl across a resume: test_checkpoints_verl.py."""

import json
import os

import pytest

from grpo_deploy.runtime.storage import checkpoints
from grpo_deploy.runtime.storage.resume import ResumeError, resolve_resume

# ------------------------------------------------------------------ the manager: both layouts


def trl_checkpoint(output_dir, step, r=1, ranks=1, complete=True, modules=("q_proj", "v_proj")):
    """A checkpoint-N as TRL + PEFT write it: adapter, optimizer, scheduler, RNG state per rank, trainer state last."""
    path = output_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": r, "target_modules": list(modules)}))
    (path / "adapter_model.safetensors").write_bytes(b"w" * 1000)
    (path / "optimizer.pt").write_bytes(b"o" * 2000)
    (path / "scheduler.pt").write_bytes(b"s")
    for rank in range(ranks):
        (path / ("rng_state.pth" if ranks == 1 else f"rng_state_{rank}.pth")).write_bytes(b"r")
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def verl_checkpoint(root, step, world=2, missing=(), data=True, r=8):
    """A global_step_N as verl 0.9.1 writes it with FSDP + LoRA (shards per rank, fsdp_config, lora meta, data.pt)."""
    actor = root / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
    (actor / "lora_train_meta.json").write_text(json.dumps({"r": r, "lora_alpha": 16, "task_type": "CAUSAL_LM"}))
    for kind in ("model", "optim", "extra_state"):
        for rank in range(world):
            name = f"{kind}_world_size_{world}_rank_{rank}.pt"
            if name not in missing:
                (actor / name).write_bytes(b"x" * 100)
    if data:
        (root / f"global_step_{step}" / "data.pt").write_bytes(b"d")
    return root / f"global_step_{step}"


def test_trl_list_sizes_states_and_shapes(tmp_path):
    trl_checkpoint(tmp_path, 10, r=4, ranks=2)
    trl_checkpoint(tmp_path, 20, complete=False)
    found = checkpoints.list_checkpoints(str(tmp_path))
    assert [(c.step, c.state) for c in found] == [(10, "complete"), (20, "half-written")]
    assert found[0].size_bytes == 1000 + 2000 + 1 + 2 + len(json.dumps({"global_step": 10})) + \
        len(json.dumps({"r": 4, "target_modules": ["q_proj", "v_proj"]}))
    assert (found[0].lora_r, found[0].world_size, found[0].target_modules) == (4, 2, ["q_proj", "v_proj"])
    assert "trainer_state.json" in found[1].reason


def test_verl_tracker_decides_what_is_complete(tmp_path):
    verl_checkpoint(tmp_path, 20)
    verl_checkpoint(tmp_path, 40, missing=("optim_world_size_2_rank_1.pt",))
    verl_checkpoint(tmp_path, 60)
    verl_checkpoint(tmp_path, 80)  # the seed's crash: written after the last tracker update
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("60")
    found = {c.step: c for c in checkpoints.list_checkpoints(str(tmp_path))}
    assert checkpoints.detect_layout(str(tmp_path)) == "verl"
    assert found[20].complete and found[60].complete and found[60].world_size == 2 and found[60].lora_r == 8
    assert found[40].state == "half-written" and "optim rank 1" in found[40].reason
    assert found[80].state == "half-written" and "newer than the tracker" in found[80].reason


def test_verl_without_tracker_nothing_is_complete(tmp_path):
    verl_checkpoint(tmp_path, 5)
    (c,) = checkpoints.list_checkpoints(str(tmp_path), "verl")
    assert c.state == "half-written" and "latest_checkpointed_iteration.txt" in c.reason


def test_prune_keeps_the_newest_complete_and_quarantines_partials(tmp_path):
    for step in (10, 20, 30):
        trl_checkpoint(tmp_path, step)
    trl_checkpoint(tmp_path, 40, complete=False)  # newer, but half-written: it does not count as the newer one
    dry = checkpoints.prune(str(tmp_path), keep=2, dry_run=True)
    assert [c.step for c in dry.removed] == [10] and (tmp_path / "checkpoint-10").exists()
    result = checkpoints.prune(str(tmp_path), keep=2)
    assert [c.step for c in result.removed] == [10] and [c.step for c in result.kept] == [20, 30]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-20", "checkpoint-30", "quarantine"]
    assert os.listdir(tmp_path / "quarantine") == ["checkpoint-40"]
    with pytest.raises(ValueError, match="at least 1"):
        checkpoints.prune(str(tmp_path), keep=0)


def test_prune_never_removes_what_the_verl_tracker_names(tmp_path):
    verl_checkpoint(tmp_path, 20)
    verl_checkpoint(tmp_path, 40)
    verl_checkpoint(tmp_path, 60)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("40")  # 60 is newer than the tracker: half-written
    result = checkpoints.prune(str(tmp_path), keep=1)
    assert [c.step for c in result.removed] == [20] and [c.step for c in result.kept] == [40]
    assert (tmp_path / "global_step_40").exists() and (tmp_path / "quarantine" / "global_step_60").exists()


def test_command_line_list_verify_prune(tmp_path, capsys):
    trl_checkpoint(tmp_path, 1)
    trl_checkpoint(tmp_path, 2, complete=False)
    assert checkpoints._main(["list", str(tmp_path)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["layout"] == "trl" and [c["state"] for c in listed["checkpoints"]] == ["complete", "half-written"]
    assert checkpoints._main(["verify", str(tmp_path)]) == 1
    capsys.readouterr()
    assert checkpoints._main(["prune", str(tmp_path), "--keep", "1"]) == 0
    pruned = json.loads(capsys.readouterr().out)
    assert pruned["removed"] == [] and [q["path"] for q in pruned["quarantined"]] == [str(tmp_path / "checkpoint-2")]
    assert checkpoints._main(["verify", str(tmp_path)]) == 0


def sharded_checkpoint(output_dir, step, ranks=2, drop=(), complete=True):
    """A checkpoint-N as TRL writes it from a trainer of several processes (FSDP2, SHARDED_STATE_DICT): DCP shards per
    rank in pytorch_model_fsdp_0/ and optimizer_0/, each with its .metadata, an RNG state per rank, no adapter file."""
    path = output_dir / f"checkpoint-{step}"
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
        (path / folder).mkdir(parents=True)
        (path / folder / ".metadata").write_bytes(b"m")
        for rank in range(ranks):
            (path / folder / f"__{rank}_0.distcp").write_bytes(b"s" * 100)
    (path / "scheduler.pt").write_bytes(b"s")
    for rank in range(ranks):
        (path / f"rng_state_{rank}.pth").write_bytes(b"r")
    for name in drop:
        os.remove(path / name)
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


@pytest.mark.parametrize(("drop", "reason"), [
    ((), None),
    (("rng_state_1.pth",), "1 RNG state file(s) for 2 ranks"),
    (("optimizer_0/.metadata",), "no optimizer_0/.metadata"),
    (("pytorch_model_fsdp_0/.metadata",), "no pytorch_model_fsdp_0/.metadata"),
    (("pytorch_model_fsdp_0/__0_0.distcp",), "shards of ranks [1], not 0..n-1"),
])
def test_a_sharded_checkpoint_is_complete_only_with_every_rank_and_both_metadata(tmp_path, drop, reason):
    path = sharded_checkpoint(tmp_path, 4, drop=drop)
    found = checkpoints.incomplete_reason(str(path))
    assert found == reason if reason is None else reason in found
    if "rng_state_1.pth" in drop:  # the listing's world size comes from the model shards, not the RNG files
        assert checkpoints.shape_of(str(path), "trl").world_size == 2


def test_a_sharded_checkpoint_missing_a_rank_is_quarantined_and_its_world_size_read(tmp_path):
    sharded_checkpoint(tmp_path, 4)
    sharded_checkpoint(tmp_path, 8, drop=("rng_state_1.pth",))  # rank 0 wrote trainer_state.json, rank 1 was killed
    two = checkpoints.Shape(world_size=2)
    resumed, moved = resolve_resume(str(tmp_path), "auto", expect=two)
    assert resumed.endswith("checkpoint-4") and [m.path.rsplit("/", 1)[-1] for m in moved] == ["checkpoint-8"]
    assert checkpoints.shape_of(resumed, "trl") == checkpoints.Shape(None, None, 2)
    with pytest.raises(ResumeError, match="world_size 2 in the checkpoint, 1 in this run"):
        resolve_resume(str(tmp_path), "auto", expect=checkpoints.Shape(world_size=1))


def test_numbers_in_names_and_metadata_are_bounded(tmp_path):
    """A step of more than 18 digits is no checkpoint's; a LoRA rank or world size outside 1..COUNT_LIMIT (a world of
    4,000 digits once had its ranks counted one by one) is not read; a rank JSON cannot parse is not either."""
    trl_checkpoint(tmp_path, 5, r=8)
    trl_checkpoint(tmp_path, 10**19, r=8)
    assert [step for step, _ in checkpoints.checkpoints(str(tmp_path))] == [5]
    for r, read in ((8, 8), (0, None), (True, None), (checkpoints.COUNT_LIMIT + 1, None), ("8", None)):
        (tmp_path / "checkpoint-5" / "adapter_config.json").write_text(json.dumps({"r": r}))
        assert checkpoints.shape_of(str(tmp_path / "checkpoint-5"), "trl").lora_r == read, r
    (tmp_path / "checkpoint-5" / "adapter_config.json").write_text('{"r": ' + "8" * 10000 + "}")
    assert checkpoints.shape_of(str(tmp_path / "checkpoint-5"), "trl").lora_r is None
    assert checkpoints.VERL_SHARD.match(f"model_world_size_{'2' * 10}_rank_0.pt") is None
