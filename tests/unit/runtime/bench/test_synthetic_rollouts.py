"""Seed-004-shaped synthetic rollouts: lengths, the profile they read, and TRL's packing of them."""

from __future__ import annotations

import pytest

from grpo_deploy.runtime.bench import synthetic_rollouts


def test_profile_supplies_lora_and_budget():
    profile = synthetic_rollouts.load_profile("h200")
    assert (profile.lora.r, profile.lora.alpha, profile.lora.target_modules) == (1, 2, "all-linear")
    assert profile.token_budget == 16384 and profile.generations == 8 and profile.completion_max == 3000


def test_profile_supplies_every_speed_switch():
    """The bench's default last row is the profile's own combination: all four switches, lora_elementwise too."""
    assert synthetic_rollouts.load_profile("h200").speed == {
        "base_dtype": "bf16", "fused_kernels": "off", "compile_layers": True, "lora_elementwise": True}
    assert synthetic_rollouts.load_profile("gb10").speed == {
        "base_dtype": "fp32", "fused_kernels": "off", "compile_layers": False, "lora_elementwise": False}


def test_seed_004_workload_lengths():
    workload = synthetic_rollouts.seed_004_workload(synthetic_rollouts.load_profile("h200"), tiny=False)
    lengths = synthetic_rollouts.completion_lengths(workload)
    assert len(lengths) == 128 and max(lengths) <= 3000
    assert 1150 < sum(lengths) / len(lengths) < 1450


def test_trl_packs_the_rollouts_with_and_without_a_budget():
    pytest.importorskip("trl")
    workload = synthetic_rollouts.Workload(groups=2, generations=4, prompt_tokens=8, completion_mean=24,
                                           completion_max=48)
    samples = synthetic_rollouts.synthetic_rollouts(workload, vocab=64)
    completion_tokens = sum(int(s["completion_mask"].sum()) for s in samples)
    off = [synthetic_rollouts.work_of(b) for b in synthetic_rollouts.microbatches(samples, 0)]
    on = [synthetic_rollouts.work_of(b) for b in synthetic_rollouts.microbatches(samples, 96)]
    assert len(off) == len(samples)
    assert sum(w.trained for w in off) == sum(w.trained for w in on) == completion_tokens
    assert all(w.forwarded <= 96 for w in on) and len(on) < len(off)
    assert sum(w.forwarded for w in on) < sum(w.forwarded for w in off)  # each group's prompt forwarded once per row
