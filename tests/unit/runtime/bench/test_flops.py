"""The trainer bench's FLOP formulas (runtime/bench/flops.py) on known shapes: parameter counts, causal attention
pairs, the three MFU conventions against TRL's own formula, and the peak lookup by device name."""

from __future__ import annotations

import pytest

from grpo_deploy.runtime.bench import flops, synthetic_rollouts

TINY_SHAPE = flops.ModelShape(hidden=4, layers=2, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10)


def test_flop_counts_on_a_known_shape():
    # Per layer: q 4x4, k 4x2, v 4x2, o 4x4, gate/up 4x8, down 8x4 = 144 weights; two layers = 288.
    assert TINY_SHAPE.layer_params == 288 and TINY_SHAPE.head_params == 40
    assert TINY_SHAPE.lora_params(1) == 2 * (8 + 6 + 6 + 8 + 12 + 12 + 12)
    work = flops.Work(forwarded=10, trained=6, pairs=30)
    attention = 3 * 2 * (4 * 2 * 2 * 30)  # fwd+bwd x layers x (4 x heads x head_dim x pairs)
    assert flops.model_flops(TINY_SHAPE, work) == 6 * 288 * 10 + 6 * 40 * 6 + attention == 21600
    assert flops.lora_flops(TINY_SHAPE, work, 1) == 4 * 288 * 10 + 4 * 40 * 6 + attention + 6 * 128 * 10
    assert flops.mfu(21600, 2.0, 10800) == pytest.approx(100.0)


def test_qwen25_shape_has_the_published_parameter_count():
    shape = flops.ModelShape(1536, 28, 12, 2, 128, 8960, 151936)
    assert shape.layer_params + shape.head_params == pytest.approx(1.54e9, rel=0.01)  # biases and norms left out
    assert shape.lora_params(1) == 28 * (1536 + 1536 + 1536 + 256 + 1536 + 256 + 1536 + 1536 + 3 * (1536 + 8960))


def test_causal_pairs_align_bottom_right():
    assert flops.causal_pairs([0, 3], [0, 3]) == 6  # 1 + 2 + 3
    assert flops.causal_pairs([0, 2, 5], [0, 5, 8]) == (2 * 3 + 3) + 6  # 2 queries over 5 keys, then a square 3


def test_trl_flops_is_trls_own_formula():
    pytest.importorskip("trl")
    from transformers import Qwen2Config
    from trl.trainer.utils import compute_flops_per_token

    config = Qwen2Config(**synthetic_rollouts.QWEN25_15B)
    shape = flops.ModelShape.from_config(config)
    work = flops.Work(forwarded=14600, trained=13000, pairs=0)
    assert flops.trl_flops(shape, work, samples=10) == compute_flops_per_token(config, 1460) * 14600


def test_peak_lookup_prefers_the_specific_name():
    assert flops.peak_flops("NVIDIA H200") == 989e12
    assert flops.peak_flops("NVIDIA H200 NVL") == 835e12
    assert flops.peak_flops("cpu") is None
