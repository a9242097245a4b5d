"""Timing and accuracy of the shim's backends on one call: failures reported, only exact backends picked."""

from __future__ import annotations

import pytest
import torch

from grpo_deploy.runtime.trainer import attention_compare, attention_shim
from tests.unit.runtime.attention_cases import random_qkv, shared_prompt_row

CASE = (37, [23, 5, 41, 1], [19, 8])


def trials_on(packed, backends, dtype=torch.float32, device="cpu"):
    q, k, v = random_qkv(packed.total, 4, 2, 64, dtype, device)
    index = packed.kv_index.to(device)
    return attention_shim.compare(
        q, k[index], v[index], packed.cu_q.to(device), packed.cu_k.to(device), packed.max_k, 0.125, backends,
        repeats=1,
    )


def test_failures_are_reported_and_only_exact_backends_picked():
    sdpa, flex = trials_on(shared_prompt_row(*CASE), ("sdpa", "flex"))
    assert sdpa.exact and sdpa.error_out < 1e-6 and sdpa.forward_backward_s > 0
    assert not flex.exact and "needs CUDA" in flex.failure
    assert attention_compare.fastest_exact([sdpa, flex]) == "sdpa"
    assert attention_compare.fastest_exact([flex]) is None


def test_an_inexact_backend_is_never_the_fastest():
    fast_but_wrong = attention_compare.Trial("wrong", 0.001, 0.002, 1e-3, 0.5)
    slow_and_right = attention_compare.Trial("right", 0.01, 0.02, 1e-3, 3e-3)
    assert not fast_but_wrong.exact and slow_and_right.exact
    assert attention_compare.fastest_exact([fast_but_wrong, slow_and_right]) == "right"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_candidates_are_measured_and_judged_against_the_reference():
    trials = trials_on(shared_prompt_row(150, [300, 200, 257], [129]), ("varlen", "cudnn", "flex"),
                       torch.bfloat16, "cuda")
    by_name = {t.backend: t for t in trials}
    assert by_name["varlen"].exact and by_name["flex"].exact
    for trial in trials:
        assert trial.exact == (trial.failure is None and max(trial.error_out, trial.error_grad) <= 2**-7)
    assert attention_compare.fastest_exact(trials) in {t.backend for t in trials if t.exact}
