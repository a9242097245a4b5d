"""The trainer's speed switches on a tiny real policy: parsing, where each can run, what each changes, and a packed
step's loss and LoRA gradients against today's path (CPU; the CUDA cases on a GPU)."""

from __future__ import annotations

import pytest

from grpo_deploy.runtime.trainer import speed as trainer_speed
from grpo_deploy.runtime.trainer.speed import Switches

torch = pytest.importorskip("torch")
pytest.importorskip("trl")


def test_parse_and_label_round_trip():
    assert Switches.parse("today") == Switches()
    switches = Switches.parse("bf16+compile+lora-ew")
    assert switches == Switches(base_dtype="bf16", compile_layers=True, lora_elementwise=True)
    assert Switches.parse(switches.label) == switches
    with pytest.raises(ValueError, match="unknown speed switch 'fp16'"):
        Switches.parse("fp16")
    with pytest.raises(ValueError, match="base_dtype must be one of"):
        Switches(base_dtype="int8")


def test_where_each_switch_cannot_run():
    assert trainer_speed.unavailable_reason(Switches(base_dtype="bf16"), "cpu", autocast=False).startswith(
        "base_dtype bf16 needs bf16 autocast")
    assert trainer_speed.unavailable_reason(Switches(base_dtype="bf16"), "cpu", autocast=True) is None
    assert "need a CUDA device" in trainer_speed.unavailable_reason(Switches(fused_kernels="liger"), "cpu", True)
    assert "needs compile" in trainer_speed.unavailable_reason(Switches(lora_elementwise=True), "cpu", True)


def _policy(switches=None):
    from grpo_deploy.runtime.bench import packed_step
    from grpo_deploy.runtime.bench.synthetic_rollouts import TINY, load_profile

    return packed_step.build_policy(TINY, None, load_profile("h200"), False, "cpu", switches, autocast=True)


def test_bf16_linear_casts_only_the_frozen_decoder_linears():
    model = _policy(Switches(base_dtype="bf16-linear"))
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert all(d == torch.float32 for n, d in dtypes.items() if "lora_" in n)
    assert all(d == torch.bfloat16 for n, d in dtypes.items() if "base_layer" in n)
    assert all(d == torch.float32 for n, d in dtypes.items() if "norm" in n or "embed" in n)
    full = _policy(Switches(base_dtype="bf16"))
    assert all(p.dtype == (torch.float32 if "lora_" in n else torch.bfloat16) for n, p in full.named_parameters())


def test_lora_elementwise_is_the_same_function_as_peft():
    """Forward and LoRA gradients of one LoRA layer, PEFT's products against the broadcast-and-sum form, in fp32
    eager on random inputs (B seeded non-zero so A has a gradient too)."""
    from grpo_deploy.runtime.bench import speed as bench_speed

    results = []
    for changed in (False, True):
        model = _policy()
        bench_speed._seed_lora_b(model)
        if changed:
            assert trainer_speed.lora_elementwise(model) == 2 * 7  # two layers x q, k, v, o, gate, up, down
        layer = trainer_speed.decoder_layers(model)[0].mlp.down_proj
        x = torch.randn(3, 5, layer.in_features, generator=torch.Generator().manual_seed(7), requires_grad=True)
        out = layer(x)
        out.square().sum().backward()
        results.append((out.detach(), x.grad, layer.lora_A["default"].weight.grad, layer.lora_B["default"].weight.grad))
    for peft_value, ours in zip(*results, strict=True):
        assert torch.allclose(peft_value, ours, rtol=1e-5, atol=1e-6)
        assert ours.abs().sum() > 0


def test_lora_elementwise_that_finds_nothing_to_fuse_says_so():
    """The cpu profile's rank 8 is above the thin-product limit: the switch changes no layer and the result says why
    (the trainer logs it and its speed_switches event carries it), rather than a silent 0."""
    from grpo_deploy.runtime.bench import packed_step
    from grpo_deploy.runtime.bench.synthetic_rollouts import TINY, load_profile

    model = packed_step.build_policy(TINY, None, load_profile("cpu"), False, "cpu")
    done = trainer_speed.apply(model, Switches(compile_layers=True, lora_elementwise=True), "cpu", autocast=False)
    assert done["lora_elementwise"] == 0 and "rank <= 4" in done["lora_elementwise_none"]
    thin = trainer_speed.apply(_policy(), Switches(compile_layers=True, lora_elementwise=True), "cpu", autocast=True)
    assert thin["lora_elementwise"] == 2 * 7 and "lora_elementwise_none" not in thin


def test_compile_keeps_the_state_dict_and_breaks_at_the_shim():
    model = _policy(Switches(compile_layers=True))
    plain = _policy()
    assert list(model.state_dict()) == list(plain.state_dict())
    assert trainer_speed.graphs_compiled() >= 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("row", ["bf16-linear", "bf16", "liger", "bf16+compile", "bf16+compile+lora-ew"])
def test_cuda_packed_step_is_exact_against_todays_path(row):
    from grpo_deploy.runtime.bench import speed as bench_speed
    from grpo_deploy.runtime.bench.synthetic_rollouts import TINY, load_profile, seed_004_workload, synthetic_rollouts

    if "liger" in row:
        pytest.importorskip("liger_kernel")
    profile = load_profile("h200")
    samples = synthetic_rollouts(seed_004_workload(profile, tiny=True), TINY["vocab_size"])
    from grpo_deploy.runtime.trainer import attention_shim

    attention_shim.install("on", "auto")
    check = bench_speed.exactness(TINY, None, profile, samples, 128, "cuda", [Switches.parse(row)])
    rows = {r["switches"]: r for r in check["rows"]}
    assert rows[Switches.parse(row).label]["exact"], rows
