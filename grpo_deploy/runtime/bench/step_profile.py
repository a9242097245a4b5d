"""Where a trainer step's time goes: the torch profiler over a few microbatches, every kernel (CPU: every leaf op) put
in one class (base-weight matrix products, LoRA's thin products, attention, the fused log-prob head, casts and
copies, norms/activations/rotary/residual elementwise work, other), and the host gaps (device idle) beside them."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable

CLASSES = ("matmul", "lora thin", "attention", "log-prob head", "casts/copies", "elementwise", "other")
HEAD_LABEL = "grpo_deploy: fused log-prob head"
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm", "aten::_addmm")
CAST_OPS = ("aten::_to_copy", "aten::copy_", "aten::to", "aten::clone", "aten::contiguous")
ELEMENTWISE_OPS = ("aten::mul", "aten::add", "aten::pow", "aten::rsqrt", "aten::mean", "aten::silu", "aten::neg",
                   "aten::cat", "aten::sub", "aten::div", "aten::sigmoid", "aten::silu_backward", "aten::sum",
                   "aten::mul_", "aten::add_", "aten::neg_", "aten::slice_backward", "aten::fill_", "aten::zero_")


def classify(kernel: str, op: str, shapes: list, ancestors: Iterable[str], rank: int) -> str:
    """The class of one kernel from its name, the op that launched it (with input shapes) and that op's ancestors."""
    name = kernel.lower()
    if any(HEAD_LABEL in a for a in ancestors) or HEAD_LABEL in op:
        return "log-prob head"
    if any(k in name for k in ("flash", "fmha", "attn", "attention", "varlen")) or "attention" in op:
        return "attention"
    # a matrix operand's last two dims; a LoRA product has one of them at the adapter's rank
    dims = [d for s in shapes if isinstance(s, (list, tuple)) and len(s) >= 2 for d in s[-2:] if isinstance(d, int)]
    is_matmul = op in MATMUL_OPS or any(k in name for k in ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitk"))
    if is_matmul:
        thin = op in MATMUL_OPS and any(0 < d <= rank for d in dims)
        return "lora thin" if thin or "gemv" in name else "matmul"
    if name.startswith("triton_"):
        fused = name.split("fused_", 1)[-1]
        copies = ("_to_copy", "to_copy", "clone", "copy")
        return "casts/copies" if fused.strip("_0123456789") in copies else "elementwise"
    if op in CAST_OPS or "copy" in name:
        return "casts/copies"
    if op in ELEMENTWISE_OPS or "elementwise" in name or "reduce" in name or "norm" in name:
        return "elementwise"
    return "other"


def _ancestors(event) -> list[str]:
    names, parent = [], getattr(event, "cpu_parent", None)
    while parent is not None:
        names.append(parent.name)
        parent = getattr(parent, "cpu_parent", None)
    return names


def breakdown_of(events, wall_us: float, rank: int, on_device: bool) -> dict:
    """Seconds per class from profiler events: device kernels on CUDA, each aten op's own time on CPU (its self time,
    children excluded, so an op with children, as CPU aten::mm with its resolve_conj, still counts); host gaps are
    the wall time no kernel covered."""
    seconds = defaultdict(float)
    kernels = defaultdict(float)
    for event in events:
        if on_device:
            launched = getattr(event, "kernels", None) or []
            items = [(k.name, k.duration) for k in launched]
        else:
            if not str(event.name).startswith("aten::"):
                continue
            items = [(event.name, event.self_cpu_time_total)]
        if not items:
            continue
        ancestors = _ancestors(event)
        for name, duration in items:
            cls = classify(name, event.name, list(getattr(event, "input_shapes", None) or []), ancestors, rank)
            seconds[cls] += duration / 1e6
            kernels[name] += duration / 1e6
    busy = sum(seconds.values())
    wall = wall_us / 1e6
    classes = {c: seconds.get(c, 0.0) for c in CLASSES}
    classes["host gaps"] = max(wall - busy, 0.0)
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    return {"wall_s": wall, "busy_s": busy, "classes": classes,
            "top_kernels": [{"name": n[:120], "s": s} for n, s in top]}


class _HeadLabel:
    """Wraps TRL's chunked log-prob autograd function so its forward and backward run inside a profiler label."""

    def __init__(self):
        self.original = None

    def __enter__(self):
        import torch
        from trl.trainer import utils

        original = self.original = utils._ChunkedLogProbFunction

        class Labelled(original):
            @staticmethod
            def forward(ctx, *args):
                with torch.profiler.record_function(HEAD_LABEL):
                    return original.forward(ctx, *args)

            @staticmethod
            def backward(ctx, *grads):
                with torch.profiler.record_function(HEAD_LABEL):
                    return original.backward(ctx, *grads)

        utils._ChunkedLogProbFunction = Labelled
        return self

    def __exit__(self, *exc):
        from trl.trainer import utils

        utils._ChunkedLogProbFunction = self.original


def profile_microbatches(run_one: Callable[[dict], None], batches: list[dict], device: str, rank: int) -> dict:
    """Profile `run_one` over `batches` (already warmed up); the breakdown in seconds per microbatch and shares."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with _HeadLabel():
        if device == "cuda":
            torch.cuda.synchronize()
        with profile(activities=activities, record_shapes=True) as prof:
            started = time.perf_counter()
            for batch in batches:
                run_one(batch)
            if device == "cuda":
                torch.cuda.synchronize()
            wall_us = (time.perf_counter() - started) * 1e6
    result = breakdown_of(prof.events(), wall_us, rank, on_device=device == "cuda")
    count = max(len(batches), 1)
    result["microbatches"] = count
    result["per_microbatch_s"] = {c: s / count for c, s in result["classes"].items()}
    result["share"] = {c: s / result["wall_s"] for c, s in result["classes"].items()} if result["wall_s"] else {}
    return result
