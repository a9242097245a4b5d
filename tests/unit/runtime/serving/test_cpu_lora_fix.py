"""grpo_deploy.runtime.serving.cpu_lora_fix on a stand-in of vLLM's CPU LoRA op (vLLM's CPU build is not on this
host; the image's verify step runs the real ops: images/cpu/verify.sh). The stand-in indexes the slots the way the
real op does (`weights[indices]`, so -1 reads the last slot), which is the bug."""

from __future__ import annotations

import types

import torch

from grpo_deploy.runtime.serving import cpu_lora_fix


def shrink(inputs, lora_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    selected = lora_weights[lora_indices_tensor]
    output_tensor[:, :selected.shape[1]] = scaling * torch.einsum("bi, boi -> bo", inputs, selected)


def expand(inputs, lora_weights, output_tensor, lora_indices_tensor, add_inputs=True):
    out = torch.einsum("bi, boi -> bo", inputs, lora_weights[lora_indices_tensor])
    if add_inputs:
        output_tensor += out
    else:
        output_tensor[:] = out


def _weights(slots=4, rank=2, hidden=3):
    return torch.arange(1, slots * rank * hidden + 1, dtype=torch.float32).reshape(slots, rank, hidden)


def test_the_stand_in_shows_the_bug_a_base_token_gets_the_last_slot():
    x, w = torch.ones(2, 3), _weights()
    out = torch.zeros(2, 2)
    shrink(x, w, out, torch.tensor([-1, 3]))
    assert torch.equal(out[0], out[1]) and out[0].abs().sum() > 0


def test_base_tokens_get_no_lora_and_adapter_tokens_what_they_got():
    x, w = torch.randn(5, 3), _weights()
    indices = torch.tensor([-1, 0, 3, -1, 1])
    before, after = torch.zeros(5, 2), torch.zeros(5, 2)
    shrink(x, w, before, indices)
    cpu_lora_fix.without_base_rows(shrink)(x, w, after, indices)
    assert torch.count_nonzero(after[indices < 0]) == 0
    assert torch.equal(after[indices >= 0], before[indices >= 0])
    # expand adding into the base layer's output: base rows keep exactly what they had
    base_out = torch.randn(5, 3)
    result = base_out.clone()
    cpu_lora_fix.without_base_rows(expand)(after, w.transpose(1, 2), result, indices, add_inputs=True)
    assert torch.equal(result[indices < 0], base_out[indices < 0])
    assert not torch.equal(result[indices >= 0], base_out[indices >= 0])


def test_no_base_token_no_change_and_misaligned_rows_left_alone():
    x, w = torch.randn(3, 3), _weights()
    a, b = torch.zeros(3, 2), torch.zeros(3, 2)
    shrink(x, w, a, torch.tensor([0, 1, 2]))
    cpu_lora_fix.without_base_rows(shrink)(x, w, b, torch.tensor([0, 1, 2]))
    assert torch.equal(a, b)
    one = torch.zeros(1, 2)  # one row of input against two indices: not lined up, passed through unchanged
    cpu_lora_fix.without_base_rows(shrink)(torch.ones(1, 3), w, one, torch.tensor([-1]))
    assert torch.count_nonzero(one) == 0


def test_a_base_row_holding_inf_gives_zero_not_nan():
    x, w = torch.tensor([[float("inf"), 1.0, 1.0], [1.0, 1.0, 1.0]]), _weights()
    out = torch.zeros(2, 2)
    cpu_lora_fix.without_base_rows(shrink)(x, w, out, torch.tensor([-1, 0]))
    assert torch.count_nonzero(out[0]) == 0 and not torch.isnan(out).any()


def test_patch_wraps_each_holder_once_and_twice_is_nothing_more():
    ops = types.SimpleNamespace(bgmv_shrink=shrink, bgmv_expand=expand, bgmv_expand_slice=expand)
    wrapper = types.SimpleNamespace(bgmv_shrink=shrink, bgmv_expand=expand)  # a holder that imported two by name
    modules = {"vllm.lora.ops.torch_ops.lora_ops": ops, "vllm.lora.punica_wrapper.punica_cpu": wrapper}
    done = cpu_lora_fix.patch(modules)
    assert done == ["vllm.lora.ops.torch_ops.lora_ops.bgmv_shrink", "vllm.lora.ops.torch_ops.lora_ops.bgmv_expand",
                    "vllm.lora.ops.torch_ops.lora_ops.bgmv_expand_slice",
                    "vllm.lora.punica_wrapper.punica_cpu.bgmv_shrink",
                    "vllm.lora.punica_wrapper.punica_cpu.bgmv_expand"]
    first = ops.bgmv_shrink
    assert cpu_lora_fix.patch(modules) == [] and ops.bgmv_shrink is first
    assert cpu_lora_fix.without_base_rows(first) is first


def test_register_without_vllm_warns_and_changes_nothing(caplog, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with caplog.at_level("WARNING"):
        cpu_lora_fix.register()
    assert "vLLM's CPU LoRA ops not found" in caplog.text
