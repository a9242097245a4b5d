"""Tests of grpo_deploy.architecture: a model's shape as a strict type, and the sizes plan derives from it (parameters,
LoRA parameters, KV bytes per token) for the models the kit knows."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from grpo_deploy import plan
from grpo_deploy.architecture import Architecture, known_models
from grpo_deploy.spec import resolve


def test_qwen25_3b_sizes_match_known_figures():
    arch = plan.Architecture.from_dict(resolve.known_models()["Qwen/Qwen2.5-3B-Instruct"])
    assert arch.params() == pytest.approx(3.09e9, rel=0.01)  # Qwen2.5-3B: 3.09 B parameters
    # LoRA r64 on all 7 linear layers of 36 blocks: r * sum(in + out)
    assert arch.lora_params(64) == 64 * 36 * (2 * 4096 + 2 * 2304 + 3 * 13056)


SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 1000}


def test_sizes_of_a_small_shape_by_hand():
    arch = Architecture.from_dict({**SMALL, "model_type": "qwen2"})  # keys of config.json it does not read are left
    assert arch.hd == 16 and arch.linear_shapes()["k_proj"] == (64, 32)
    per_layer = 64 * 64 + 64 * 32 * 2 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert arch.params() == per_layer * 2 + 1000 * 64 + 64
    assert Architecture(**SMALL, tie_word_embeddings=False).params() == arch.params() + 1000 * 64
    assert arch.lora_params(8, ["q_proj", "v_proj"]) == 8 * (128 + 96) * 2
    assert arch.lora_params(8, "q_proj") == 8 * 128 * 2
    assert arch.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 2


@pytest.mark.parametrize("change", [{"hidden_size": 0}, {"hidden_size": 2**24 + 1}, {"vocab_size": "1000"},
                                    {"num_hidden_layers": True}, {"rope": 1}])
def test_a_bad_shape_is_refused(change):
    with pytest.raises(ValidationError):
        Architecture(**{**SMALL, **change})


def test_every_known_model_has_a_valid_shape():
    models = known_models()
    assert "Qwen/Qwen2.5-Math-1.5B" in models
    for name, shape in models.items():
        assert Architecture(**shape).params() > 0, name
