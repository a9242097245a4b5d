"""Attention shim against a dense fp32 per-sample reference, and its installation into TRL's packed attention.

Tolerances: fp32 runs must match the reference to fp32 rounding (torch.testing defaults for float32: rtol 1.3e-6,
atol 1e-5). bf16 runs are compared norm-wise, ||shim - ref|| / ||ref|| <= 2**-7 (7.8e-3, two bf16 units of
roundoff), for the output and for the q, k and v gradients; inputs are bf16-representable in both runs.
"""

import pytest
import torch

from grpo_deploy.runtime.trainer import attention_shim
from grpo_deploy.runtime.trainer.attention_shim import VarlenAttention
from tests.unit.runtime.attention_cases import (
    dense_reference,
    from_segments,
    random_qkv,
    relative_error,
    shared_prompt_row,
)

BF16_TOLERANCE = 2**-7

# (prompt length, completion lengths, plain causal sample lengths): a trainer-like group plus unrelated samples.
CASES = [
    (37, [23, 5, 41, 1], [19, 8]),
    (12, [3, 3, 3, 3, 3, 3, 3, 3], []),
    (1, [30], [1, 64]),
]
HEADS = [(4, 2), (4, 1), (2, 2)]  # (query heads, key/value heads)


def run(shim, packed, dtype, heads, kv_heads, device="cpu", window=None, softcap=0.0):
    """Shim and reference outputs plus the q/k/v gradients of both, for one packed row."""
    q, k, v = random_qkv(packed.total, heads, kv_heads, 64, dtype, device)
    rq, rk, rv = random_qkv(packed.total, heads, kv_heads, 64, torch.float32, device)
    index = packed.kv_index.to(device)
    out = shim.flash_attn_varlen_func(
        q,
        k.index_select(0, index),
        v.index_select(0, index),
        packed.cu_q.to(device),
        packed.cu_k.to(device),
        packed.max_q,
        packed.max_k,
        causal=True,
        window_size=(window - 1, 0) if window else (-1, -1),
        softcap=softcap,
    )
    ref = dense_reference(rq, rk, rv, packed, window=window, softcap=softcap)
    upstream = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(device)
    (out.float() * upstream).sum().backward()
    (ref * upstream).sum().backward()
    return out, ref, (q.grad, k.grad, v.grad), (rq.grad, rk.grad, rv.grad)


@pytest.mark.parametrize("dense_limit", [attention_shim.DENSE_LIMIT, 0], ids=["block-diagonal", "per-segment"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("case", CASES, ids=["group+plain", "eight-short", "one-token"])
def test_fp32_matches_reference_exactly(case, heads, dense_limit):
    packed = shared_prompt_row(*case)
    out, ref, grads, ref_grads = run(VarlenAttention("sdpa", dense_limit), packed, torch.float32, *heads)
    assert out.shape == (packed.total, heads[0], 64) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref)
    for grad, expected in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("dense_limit", [attention_shim.DENSE_LIMIT, 0], ids=["block-diagonal", "per-segment"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}kv{h[1]}")
def test_bf16_within_rounding(heads, dense_limit):
    packed = shared_prompt_row(*CASES[0])
    out, ref, grads, ref_grads = run(VarlenAttention("sdpa", dense_limit), packed, torch.bfloat16, *heads)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, ref) <= BF16_TOLERANCE
    for grad, expected in zip(grads, ref_grads, strict=True):
        assert relative_error(grad, expected) <= BF16_TOLERANCE


def test_completion_rows_see_the_shared_prompt():
    """A completion's first token attends to the whole prompt (bottom-right alignment), not just its first token."""
    packed = shared_prompt_row(16, [4], [])
    q, k, v = random_qkv(packed.total, 2, 1, 64, torch.float32)
    out = VarlenAttention("sdpa").flash_attn_varlen_func(
        q, k[packed.kv_index], v[packed.kv_index], packed.cu_q, packed.cu_k, 16, 20, causal=True
    )
    first_token_only = v[0].repeat_interleave(2, dim=0)  # what top-left alignment would give completion row 0
    torch.testing.assert_close(out[16:], dense_reference(q, k, v, packed)[16:])
    assert not torch.allclose(out[16], first_token_only, atol=1e-3)


@pytest.mark.parametrize("dense_limit", [attention_shim.DENSE_LIMIT, 0], ids=["block-diagonal", "per-segment"])
def test_sliding_window_and_softcap(dense_limit):
    packed = shared_prompt_row(*CASES[0])
    shim = VarlenAttention("sdpa", dense_limit)
    out, ref, grads, ref_grads = run(shim, packed, torch.float32, 4, 2, window=8, softcap=30.0)
    torch.testing.assert_close(out, ref)
    for grad, expected in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, expected)


def test_queries_without_keys_give_zeros_and_finite_gradients():
    q, k, v = random_qkv(4, 2, 2, 64, torch.float32)
    # Three queries, one key, causal bottom-right: the first two queries see nothing (FlashAttention returns 0).
    out = VarlenAttention("sdpa").flash_attn_varlen_func(
        q[:3], k[:1], v[:1], torch.tensor([0, 3]), torch.tensor([0, 1]), 3, 1, causal=True
    )
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    torch.testing.assert_close(out[2], v[0])
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_rejects_mismatched_heads():
    q, k, v = random_qkv(5, 3, 2, 64, torch.float32)
    with pytest.raises(ValueError, match="not a multiple"):
        VarlenAttention("sdpa").flash_attn_varlen_func(q, k, v, torch.tensor([0, 5]), torch.tensor([0, 5]), 5, 5)


# --- square segments (cuDNN and FlexAttention layout) ----------------------------------------------------------------

LONG_CASE = (150, [300, 200, 257], [129])  # several 128-row blocks, some spanning two segments


def square_reference(q, k, v, cu_seqlens, segment, max_seqlen, scale):
    """A square-segment kernel written with plain causal SDPA per segment, to test the layout around the kernels."""
    bounds = cu_seqlens.tolist()
    out = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))
        ks, vs = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=0) for x in (ks, vs))
        out.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale))
    return torch.cat([o.transpose(0, 1) for o in out])


@pytest.mark.parametrize("case", [*CASES, LONG_CASE], ids=["group+plain", "eight-short", "one-token", "long"])
def test_square_layout_gives_bottom_right_causal_attention(case):
    """Queries padded to their keys, a top-left causal kernel, and the padding dropped: FlashAttention's result."""
    packed = shared_prompt_row(*case)
    q, k, v = random_qkv(packed.total, 4, 2, 64, torch.float32)
    out = attention_shim.square_attention(
        square_reference, q, k[packed.kv_index], v[packed.kv_index], packed.cu_q, packed.cu_k, packed.max_k, 0.125
    )
    ref = dense_reference(q, k, v, packed, scale=0.125)
    torch.testing.assert_close(out, ref)
    upstream = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    expected = torch.autograd.grad((ref * upstream).sum(), (q, k, v))
    for grad, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(grad, want)


@pytest.mark.parametrize("case", [CASES[0], LONG_CASE], ids=["group+plain", "long"])
def test_flex_document_block_mask_is_exact(case, monkeypatch):
    """The block tables (partial and full blocks) give the same forward as the dense reference (eager FlexAttention
    on CPU: forward only, CPU has no FlexAttention backward)."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    monkeypatch.setattr(attention_shim, "_compiled_flex", lambda: flex.flex_attention)
    packed = shared_prompt_row(*case)
    q, k, v = (x.detach() for x in random_qkv(packed.total, 4, 2, 64, torch.float32))
    out = attention_shim.square_attention(
        attention_shim.flex_document, q, k[packed.kv_index], v[packed.kv_index], packed.cu_q, packed.cu_k,
        packed.max_k, 0.125,
    )
    torch.testing.assert_close(out, dense_reference(q, k, v, packed, scale=0.125))


def test_fastest_without_cuda_falls_back_to_sdpa():
    packed = shared_prompt_row(*CASES[0])
    out, ref, grads, ref_grads = run(VarlenAttention("fastest"), packed, torch.float32, 4, 2)
    torch.testing.assert_close(out, ref)
    assert VarlenAttention("fastest").choices == {}


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown attention backend"):
        VarlenAttention("fa4")


# --- installation into TRL ---------------------------------------------------------------------------------------


@pytest.fixture
def packing(monkeypatch):
    packing = pytest.importorskip("trl.experimental.async_grpo.packing")
    monkeypatch.setattr(packing, "_flash_attn", packing._flash_attn)  # restored after the test
    return packing


def trl_packed_row(packing):
    """Three completions of one prompt and one unrelated sample, packed by TRL's own TreeRow, as the trainer does."""
    row = packing.TreeRow()
    prompt = [5, 6, 7, 8, 9, 10, 11]
    for group, completion in [(0, [1, 2, 3, 4]), (0, [1, 2, 9]), (0, [4, 4, 4, 4, 4]), (1, [20, 21, 22])]:
        ids = (prompt if group == 0 else [30, 31]) + completion
        mask = [0] * (len(ids) - len(completion)) + [1] * len(completion)
        row.add(
            {
                "input_ids": torch.tensor(ids),
                "completion_mask": torch.tensor(mask),
                "old_log_probs": torch.zeros(len(ids)),
                "advantage": 0.0,
                "group_id": group,
            }
        )
    return row.pack()


class _Layer(torch.nn.Module):
    """Just enough of a decoder layer for `tree_attention`: a config and a Linear whose dtype it reads."""

    def __init__(self):
        super().__init__()
        self.config = object()
        self.proj = torch.nn.Linear(2, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto keeps FlashAttention-3 where a GPU might provide it")
def test_install_auto_routes_trl_packing_through_shim(packing):
    assert attention_shim.fa3_unavailable_reason() == "no CUDA device"
    message = attention_shim.install("auto")
    assert "installed" in message and attention_shim.installed()
    batch = trl_packed_row(packing)
    total, (max_q, max_k) = len(batch["input_ids"]), batch["tree_max_seqlens"].tolist()
    q, k, v = random_qkv(total, 4, 2, 64, torch.float32)
    calls = attention_shim.SHIM.calls
    out, weights = packing.tree_attention(
        _Layer(),
        q.transpose(0, 1).unsqueeze(0),  # transformers hands attention (batch, heads, tokens, head_dim)
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        None,
        tree_kv_index=batch["tree_kv_index"],
        tree_cu_seqlens_q=batch["tree_cu_seqlens_q"],
        tree_cu_seqlens_k=batch["tree_cu_seqlens_k"],
        tree_max_seqlen_q=max_q,
        tree_max_seqlen_k=max_k,
        scaling=0.125,
    )
    assert attention_shim.SHIM.calls == calls + 1
    assert weights is None and out.shape == (1, total, 4, 64)
    reference_layout = from_segments(
        batch["tree_kv_index"], batch["tree_cu_seqlens_q"], batch["tree_cu_seqlens_k"], max_q, max_k
    )
    torch.testing.assert_close(out[0], dense_reference(q, k, v, reference_layout, scale=0.125))


def test_install_off_and_bad_mode_leave_trl_alone(packing):
    original = packing._flash_attn
    assert "off" in attention_shim.install("off")
    assert packing._flash_attn is original and not attention_shim.installed()
    with pytest.raises(ValueError, match="attention_shim must be one of"):
        attention_shim.install("maybe")


def test_install_on_is_idempotent(packing):
    attention_shim.install("on")
    assert packing._flash_attn() is attention_shim.SHIM
    assert attention_shim.install("on") == "attention shim already installed"


def test_install_takes_the_backend_from_the_environment(packing, monkeypatch):
    monkeypatch.setattr(attention_shim.SHIM, "backend", attention_shim.SHIM.backend)  # restored after the test
    monkeypatch.setattr(packing, "_flash_attn", packing._flash_attn)
    monkeypatch.setenv(attention_shim.BACKEND_ENV, "sdpa")
    message = attention_shim.install("on")
    assert attention_shim.SHIM.backend == "sdpa" and "backend sdpa" in message
    monkeypatch.setenv(attention_shim.BACKEND_ENV, "fa4")
    with pytest.raises(ValueError, match="attention backend must be one of"):
        attention_shim.install("on")


# --- CUDA backend (run on a GPU machine) -------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("case", CASES, ids=["group+plain", "eight-short", "one-token"])
def test_cuda_varlen_bf16_within_rounding(case, heads):
    pytest.importorskip("torch.nn.attention.varlen")
    packed = shared_prompt_row(*case)
    out, ref, grads, ref_grads = run(VarlenAttention("varlen"), packed, torch.bfloat16, *heads, device="cuda")
    assert relative_error(out, ref) <= BF16_TOLERANCE
    for grad, expected in zip(grads, ref_grads, strict=True):
        assert relative_error(grad, expected) <= BF16_TOLERANCE


@pytest.mark.gpu
@cuda
def test_cuda_sdpa_fallback_fp32_exact():
    packed = shared_prompt_row(*CASES[0])
    out, ref, grads, ref_grads = run(VarlenAttention(), packed, torch.float32, 4, 2, device="cuda")
    torch.testing.assert_close(out, ref)
    for grad, expected in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, expected)


@pytest.mark.gpu
@cuda
def test_cuda_auto_picks_varlen_for_bf16():
    pytest.importorskip("torch.nn.attention.varlen")
    shim = VarlenAttention()
    q = torch.zeros(4, 2, 64, device="cuda", dtype=torch.bfloat16)
    assert shim._use_varlen(q, softcap=0.0)
    assert not shim._use_varlen(q.float(), softcap=0.0)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("backend", ["cudnn", "flex"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("case", [*CASES, LONG_CASE], ids=["group+plain", "eight-short", "one-token", "long"])
def test_cuda_square_backends_bf16_within_rounding(case, heads, backend):
    """Forward of both square-segment kernels, gradients of FlexAttention. cuDNN's gradients through jagged nested
    tensors were wrong on torch 2.11 (H200, 2026-11-30: relative error 0.2 to 3e12), so `fastest` must reject it:
    test_attention_compare checks that it does."""
    packed = shared_prompt_row(*case)
    out, ref, grads, ref_grads = run(VarlenAttention(backend), packed, torch.bfloat16, *heads, device="cuda")
    assert relative_error(out, ref) <= BF16_TOLERANCE
    if backend == "flex":
        for grad, expected in zip(grads, ref_grads, strict=True):
            assert relative_error(grad, expected) <= BF16_TOLERANCE


@pytest.mark.gpu
@cuda
def test_cuda_fastest_picks_an_exact_backend_once():
    packed = shared_prompt_row(*LONG_CASE)
    shim = VarlenAttention("fastest")
    out, ref, grads, ref_grads = run(shim, packed, torch.bfloat16, 4, 2, device="cuda")
    assert relative_error(out, ref) <= BF16_TOLERANCE
    ((key, choice),) = shim.choices.items()
    assert choice in attention_shim.FAST_CANDIDATES
    assert any(t.backend == choice and t.exact for t in shim.trials[key])
