"""Tests of grpo_deploy.profiles: every profile file parses, carries a reason per value, and the seed facts."""

import pytest

from grpo_deploy import profiles


def test_the_four_profiles_exist():
    assert profiles.names() == ["a100", "cpu", "gb10", "h200"]


@pytest.mark.parametrize("name", ["a100", "cpu", "gb10", "h200"])
def test_every_setting_has_a_reason(name):
    p = profiles.load(name)
    assert p.engines and p.hardware["arch"]
    for section, values in p.settings.items():
        for key, setting in values.items():
            assert len(setting.why) > 5, f"{name}: {section}.{key} has no reason"


def test_seed_values():
    a100, gb10, h200 = profiles.load("a100"), profiles.load("gb10"), profiles.load("h200")
    assert a100.value("verl", "actor_rollout_ref.rollout.tensor_model_parallel_size") == 1
    assert a100.value("verl", "actor_rollout_ref.rollout.gpu_memory_utilization") == 0.8
    assert a100.value("verl", "trainer.total_epochs") == 5 and a100.value("checkpoints", "keep") == 3
    assert gb10.value("vllm", "gpu_memory_utilization") == 0.6 and gb10.value("runtime", "attention_shim") == "on"
    assert gb10.value("trl", "token_budget") == 16384 and gb10.value("trl", "gradient_checkpointing") is False
    assert h200.value("lora", "r") == 1 and h200.value("trl", "learning_rate") == 4e-5
    assert h200.hardware["arch"] == ["x86_64"] and gb10.hardware["arch"][0] == "aarch64"


def test_unknown_profile_error_lists_known():
    with pytest.raises(profiles.ProfileError, match="a100, cpu, gb10, h200"):
        profiles.load("b200")


def test_malformed_setting_rejected():
    with pytest.raises(profiles.ProfileError, match="must be"):
        profiles._parse("x", {"name": "x", "settings": {"trl": {"learning_rate": 0.1}}})


def test_engine_mismatch_names_the_profiles_that_fit():
    assert profiles.engine_mismatch(profiles.load("gb10"), "trl-async") is None
    msg = profiles.engine_mismatch(profiles.load("a100"), "trl-async")
    assert msg == ("profile 'a100' does not support engine 'trl-async' (it supports verl); "
                   "profiles for trl-async: cpu, gb10, h200")


@pytest.mark.parametrize("name", ["a100", "cpu", "gb10", "h200"])
def test_kubernetes_gpu_products_name_the_profiles_gpu(name):
    """GPU Feature Discovery's nvidia.com/gpu.product is the nvidia-smi name with spaces as '-': each listed product
    must be the GPU that preflight accepts (gpu_name_contains); a GPU profile lists at least one, cpu none."""
    hw = profiles.load(name).hardware
    products = hw.get("k8s_gpu_products") or []
    if hw["accelerator"] != "cuda":
        assert not products
        return
    assert products and len(set(products)) == len(products)
    for product in products:
        assert product.startswith("NVIDIA-") and " " not in product
        assert hw["gpu_name_contains"] in product.replace("-", " "), (product, hw["gpu_name_contains"])
