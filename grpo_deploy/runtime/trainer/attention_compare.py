"""Timing and accuracy of the attention shim's backends on one packed call, and the pick of the fastest exact one.
The shims to time and the fp32 reference are given (attention_shim.compare builds them), so this module needs none of
the shim's own code."""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import torch

# Relative error a bf16 backend may show against the fp32 reference (the bf16 tolerance of the shim's tests).
EXACT_TOLERANCE = 2**-7


@dataclass(frozen=True)
class Trial:
    """One backend on one packed call: median forward and forward+backward seconds, relative errors, or why not."""

    backend: str
    forward_s: float | None = None
    forward_backward_s: float | None = None
    error_out: float | None = None
    error_grad: float | None = None
    failure: str | None = None

    @property
    def exact(self) -> bool:
        return self.failure is None and max(self.error_out, self.error_grad) <= EXACT_TOLERANCE


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Norm-wise relative error ||actual - expected|| / ||expected||, in fp32."""
    actual, expected = actual.detach().float(), expected.detach().float()
    return float((actual - expected).norm() / expected.norm())


def _timed(fn, repeats: int) -> float:
    """Median seconds of `fn()` after one warm-up call: CUDA events on a GPU, the host clock elsewhere."""
    fn()
    times = []
    for _ in range(repeats):
        if not torch.cuda.is_available():
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return statistics.median(times)


@contextlib.contextmanager
def side_computation(device_type: str):
    """Run a self-contained forward/backward inside a model's forward: no autocast (the reference stays fp32), no
    gradient checkpointing's saved-tensor hooks (identity hooks shadow them), gradients on."""
    with torch.autocast(device_type, enabled=False), torch.enable_grad():
        with torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
            yield


def compare_backends(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, scale, shims, reference_shim,
                     repeats: int = 5) -> list[Trial]:
    """Time each shim's causal forward and forward+backward on copies of one call's tensors, and measure its output
    and q/k/v-gradient error against *reference_shim* run in fp32. A shim has `.backend` and FlashAttention's
    `flash_attn_varlen_func`."""
    inputs = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    upstream = torch.randn(q.shape, device=q.device, generator=torch.Generator(q.device).manual_seed(0))
    reference = [x.detach().float().requires_grad_(True) for x in inputs]
    call = (cu_seqlens_q, cu_seqlens_k, int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()), max_seqlen_k)
    ref_out = reference_shim.flash_attn_varlen_func(*reference, *call, softmax_scale=scale, causal=True)
    (ref_out * upstream).sum().backward()
    reference = (ref_out, [x.grad for x in reference])
    return [_trial(shim, inputs, call, scale, upstream, reference, repeats) for shim in shims]


def _trial(shim, inputs, call, scale, upstream, reference, repeats: int) -> Trial:
    """One backend of `compare_backends`; a backend that cannot run here is reported with its error, not raised."""

    def forward():
        return shim.flash_attn_varlen_func(*inputs, *call, softmax_scale=scale, causal=True)

    def forward_backward():
        for x in inputs:
            x.grad = None
        (forward().float() * upstream).sum().backward()

    try:
        with torch.no_grad():
            forward_s = _timed(forward, repeats)
        forward_backward_s = _timed(forward_backward, repeats)
        error_out = relative_error(forward(), reference[0])
        error_grad = max(relative_error(x.grad, g) for x, g in zip(inputs, reference[1], strict=True))
    except Exception as error:  # noqa: BLE001 - a candidate that cannot run here is reported, not fatal
        return Trial(shim.backend, failure=f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}")
    return Trial(shim.backend, forward_s, forward_backward_s, error_out, error_grad)


def fastest_exact(trials: list[Trial]) -> str | None:
    """The backend with the shortest forward+backward among those within the bf16 tolerance, or None."""
    exact = [t for t in trials if t.exact]
    return min(exact, key=lambda t: t.forward_backward_s).backend if exact else None
