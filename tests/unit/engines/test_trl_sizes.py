"""Tests of grpo_deploy.engines.trl_sizes: a TRL checkpoint's size by its parts, pinned against a real rehearsal
checkpoint's files (what the seed-000 replay, tests/faults/test_disk_full_replay.py, found: the estimate was 19 times
the real size), the trainer state growing with the steps, and a GPU model's tokenizer."""

from __future__ import annotations

from grpo_deploy import plan, spec
from grpo_deploy.engines import trl_sizes
from grpo_deploy.spec import resolve
from tests.specs import spec_yaml

# checkpoint-2 of the rehearsal (tiny-qwen2, LoRA r8 all-linear; transformers 5.24, TRL 1.16, PEFT 0.21), as listed
# on its volume: file sizes in bytes. On a 4 KiB-block filesystem it occupies 487,424 B.
REHEARSAL_CHECKPOINT_2 = {
    "README.md": 5222, "adapter_config.json": 1607, "adapter_model.safetensors": 134608, "chat_template.jinja": 207,
    "optimizer.pt": 285723, "rng_state.pth": 14327, "rollout_state.json": 39, "scheduler.pt": 1465,
    "tokenizer.json": 3496, "tokenizer_config.json": 580, "trainer_state.json": 5872, "training_args.bin": 6033,
}
TRAINER_STATE_AT = {2: 5872, 4: 11339, 6: 16720}  # its log_history grows with every logged step


def _res(**changes):
    return resolve.resolve(spec.loads(spec_yaml("cpu", hosts=(), **changes)))


def _blocks(n: int) -> int:
    return -(-n // 4096) * 4096


def test_trl_estimate_brackets_a_real_rehearsal_checkpoint():
    res = _res(**{"checkpoints.save_every": 2, "overrides": {"trl": {"max_steps": 8}}})
    arch = plan.Architecture.from_dict(res.architecture)
    estimate = plan.checkpoint_bytes(res, arch, 2)[0]
    apparent = sum(REHEARSAL_CHECKPOINT_2.values())
    allocated = sum(_blocks(n) for n in REHEARSAL_CHECKPOINT_2.values())
    assert apparent <= allocated <= estimate <= 1.15 * apparent  # was 8.8 MB: 19 times the real 459 KB
    assert len(REHEARSAL_CHECKPOINT_2) == trl_sizes.TRL_CHECKPOINT_FILES
    grow = [trl_sizes.checkpoint_parts(res, arch, s)["trainer_state"] for s in TRAINER_STATE_AT]
    assert all(real <= est <= real + 3000 for real, est in zip(TRAINER_STATE_AT.values(), grow, strict=True)), grow


def test_qwen_tokenizer_keeps_a_gpu_checkpoint_in_megabytes():
    res = resolve.resolve(spec.loads(spec_yaml("gb10")))
    arch = plan.Architecture.from_dict(res.architecture)
    parts = trl_sizes.checkpoint_parts(res, arch, 500)
    assert 7e6 < parts["tokenizer"] < 8e6  # Qwen2.5's tokenizer.json: 7.03 MB
