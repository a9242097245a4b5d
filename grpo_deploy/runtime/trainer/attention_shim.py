"""FlashAttention-3 stand-in for TRL's packed tree attention (SDPA, torch varlen, cuDNN or FlexAttention backends),
the start-up pick of the fastest exact one, and its install()."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpo_deploy.runtime.trainer.attention_compare import Trial, compare_backends, fastest_exact, side_computation
from grpo_deploy.runtime.trainer.config import ATTENTION_BACKENDS as BACKENDS
from grpo_deploy.runtime.trainer.config import ATTENTION_SHIM_MODES as MODES

# Above this many (query x key) score entries per head, the SDPA backend stops building one block-diagonal mask over
# the whole packed row and loops over segments instead (memory O(Tq x Tk) versus O(sum of per-segment products)).
DENSE_LIMIT = 1 << 22

# GPUs with a published FlashAttention-3 build on the kernels hub (Ampere A100 and Hopper).
FA3_CAPABILITIES = {(8, 0), (9, 0)}

# What `fastest` times on CUDA: torch varlen (FlashAttention-2 kernels), SDPA on jagged nested tensors with the cuDNN
# backend, and compiled FlexAttention with a document mask. A candidate that fails or misses the tolerance is dropped.
FAST_CANDIDATES = ("varlen", "cudnn", "flex")
# Environment variable that chooses the backend when the trainer installs the shim (a profile's trainer env).
BACKEND_ENV = "GRPO_ATTENTION_BACKEND"
FLEX_BLOCK = 128


@dataclass(frozen=True)
class Segments:
    """Per-segment query/key bounds of one packed call, as Python ints."""

    q_bounds: list[int]
    k_bounds: list[int]

    @classmethod
    def from_cu(cls, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor) -> Segments:
        q_bounds = [int(x) for x in cu_seqlens_q.tolist()]
        k_bounds = [int(x) for x in cu_seqlens_k.tolist()]
        if len(q_bounds) != len(k_bounds):
            raise ValueError(f"cu_seqlens_q has {len(q_bounds)} entries but cu_seqlens_k has {len(k_bounds)}")
        return cls(q_bounds, k_bounds)

    def __iter__(self):
        return iter(zip(self.q_bounds[:-1], self.q_bounds[1:], self.k_bounds[:-1], self.k_bounds[1:], strict=True))


def _window(causal: bool, window_size: tuple[int, int]) -> tuple[int, int]:
    """FlashAttention's (left, right) window; -1 is unbounded, and causal caps the right side at 0."""
    left, right = (int(w) for w in window_size)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def segment_mask(seg_q: torch.Tensor, pos_q: torch.Tensor, seg_k: torch.Tensor, pos_k: torch.Tensor, left: int,
                 right: int) -> torch.Tensor:
    """Boolean (Tq, Tk) mask: same segment, and the key inside the query's window. `pos_q` is a query's position on
    its segment's key axis, i.e. aligned bottom-right (query i of a segment with Lq queries and Lk keys sits at key
    position i + Lk - Lq), which is FlashAttention's convention when q is shorter than k."""
    allowed = seg_q[:, None] == seg_k[None, :]
    offset = pos_k[None, :] - pos_q[:, None]
    if right >= 0:
        allowed &= offset <= right
    if left >= 0:
        allowed &= offset >= -left
    return allowed


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float):
    """Masked attention over (H, Tq, D) x (H, Tk, D); rows without any allowed key return zeros, like FlashAttention."""
    has_key = mask.any(dim=-1)
    # A fully masked row makes softmax produce NaN, whose gradient would leak into k and v even after the row is
    # zeroed; letting such rows see every key keeps the math finite, and the `where` below discards their output.
    safe_mask = mask | ~has_key[:, None]
    if softcap and softcap > 0:
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~safe_mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe_mask, scale=scale)
    if bool(has_key.all()):
        return out
    return torch.where(has_key[None, :, None], out, torch.zeros((), dtype=out.dtype, device=out.device))


def _expand_kv(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Repeat KV heads (T, Hkv, D) to the query head count: query head h reads KV head h // (Hq / Hkv)."""
    num_kv_heads = x.shape[1]
    if num_kv_heads == num_q_heads:
        return x
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} key/value heads")
    return x.repeat_interleave(num_q_heads // num_kv_heads, dim=1)


def _positions(bounds_q: list[int], bounds_k: list[int], device) -> tuple[torch.Tensor, ...]:
    """Segment id and bottom-right-aligned position of every packed query and key row."""
    lens_q = torch.tensor([b - a for a, b in zip(bounds_q[:-1], bounds_q[1:], strict=True)], device=device)
    lens_k = torch.tensor([b - a for a, b in zip(bounds_k[:-1], bounds_k[1:], strict=True)], device=device)
    segments = torch.arange(len(lens_q), device=device)
    seg_q = torch.repeat_interleave(segments, lens_q)
    seg_k = torch.repeat_interleave(segments, lens_k)
    start_q = torch.tensor(bounds_q[:-1], device=device)
    start_k = torch.tensor(bounds_k[:-1], device=device)
    pos_q = torch.arange(bounds_q[-1] - bounds_q[0], device=device) + bounds_q[0] - start_q[seg_q]
    pos_q = pos_q + (lens_k - lens_q)[seg_q]
    pos_k = torch.arange(bounds_k[-1] - bounds_k[0], device=device) + bounds_k[0] - start_k[seg_k]
    return seg_q, pos_q, seg_k, pos_k


def sdpa_varlen(q, k, v, segments: Segments, scale: float, left: int, right: int, softcap: float, dense_limit: int):
    """Varlen attention on any device with PyTorch SDPA: one block-diagonal call for short rows, else per segment."""
    num_heads = q.shape[1]
    k, v = _expand_kv(k, num_heads), _expand_kv(v, num_heads)
    total_q = segments.q_bounds[-1] - segments.q_bounds[0]
    total_k = segments.k_bounds[-1] - segments.k_bounds[0]
    if total_q * total_k <= dense_limit:
        q0, k0 = segments.q_bounds[0], segments.k_bounds[0]
        seg_q, pos_q, seg_k, pos_k = _positions(segments.q_bounds, segments.k_bounds, q.device)
        mask = segment_mask(seg_q, pos_q, seg_k, pos_k, left, right)
        out = _attend(
            q[q0 : q0 + total_q].transpose(0, 1),
            k[k0 : k0 + total_k].transpose(0, 1),
            v[k0 : k0 + total_k].transpose(0, 1),
            mask,
            scale,
            softcap,
        )
        return out.transpose(0, 1)
    outputs = []
    for q_start, q_end, k_start, k_end in segments:
        len_q, len_k = q_end - q_start, k_end - k_start
        pos_q = torch.arange(len_q, device=q.device) + (len_k - len_q)
        pos_k = torch.arange(len_k, device=q.device)
        zeros_q = torch.zeros(len_q, dtype=torch.long, device=q.device)
        zeros_k = torch.zeros(len_k, dtype=torch.long, device=q.device)
        mask = segment_mask(zeros_q, pos_q, zeros_k, pos_k, left, right)
        outputs.append(
            _attend(
                q[q_start:q_end].transpose(0, 1),
                k[k_start:k_end].transpose(0, 1),
                v[k_start:k_end].transpose(0, 1),
                mask,
                scale,
                softcap,
            ).transpose(0, 1)
        )
    return torch.cat(outputs, dim=0)


def _torch_varlen():
    """PyTorch's native varlen attention (FlashAttention-2 kernels on CUDA), or None when this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


class VarlenAttention:
    """Object with FlashAttention's `flash_attn_varlen_func`, which is all TRL's `tree_attention` calls.

    Tensors are packed as (total_tokens, heads, head_dim); `cu_seqlens_q`/`cu_seqlens_k` are int32 segment offsets.
    Causal masking is aligned bottom-right when a segment has fewer queries than keys, and key/value may carry fewer
    heads than the query (grouped-query attention). Returns a tensor shaped like `q`.

    Backends: `auto` uses `torch.nn.attention.varlen.varlen_attn` for fp16/bf16 on CUDA, else SDPA on the packed row;
    `cudnn` and `flex` are the square-segment kernels below (CUDA fp16/bf16, causal, no window or softcap); `fastest`
    times every usable candidate on the first CUDA call of each head shape and keeps the fastest exact one.
    """

    def __init__(self, backend: str = "auto", dense_limit: int = DENSE_LIMIT):
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}: use {', '.join(BACKENDS)}")
        self.backend = backend
        self.dense_limit = dense_limit
        self.calls = 0
        self.choices: dict[tuple, str] = {}  # `fastest`: (dtype, heads, kv heads, head_dim) -> backend picked
        self.trials: dict[tuple, list] = {}  # ... and the `attention_compare.Trial` of each candidate

    def _use_varlen(self, q: torch.Tensor, softcap: float) -> bool:
        if self.backend == "sdpa":
            return False
        usable = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and not softcap
        if self.backend == "varlen":
            if not usable or _torch_varlen() is None:
                raise RuntimeError("torch varlen attention needs CUDA fp16/bf16 tensors, no softcap, and torch >= 2.10")
            return True
        return usable and _torch_varlen() is not None

    def _pick(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, scale, left, right, softcap) -> str:
        """The backend for this call: fixed by `backend`, or measured once per head shape for `fastest`."""
        square = square_usable(q, left, right, softcap)
        if self.backend in ("cudnn", "flex"):
            if not square:
                raise RuntimeError(f"{self.backend} attention needs CUDA fp16/bf16 tensors, causal, no window/softcap")
            return self.backend
        if self.backend == "fastest" and square:
            key = (q.dtype, q.shape[1], k.shape[1], q.shape[2])
            if key not in self.choices:
                with side_computation(q.device.type):
                    trials = compare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, scale, FAST_CANDIDATES)
                self.trials[key] = trials
                self.choices[key] = fastest_exact(trials) or "sdpa"
            return self.choices[key]
        return "varlen" if self._use_varlen(q, softcap) else "sdpa"

    # Eager under torch.compile (a regionally compiled decoder layer breaks its graph here): the backend pick and the
    # kernels' Python-int lengths stay out of the compiled code, so a row of a new length recompiles nothing here.
    @torch.compiler.disable
    def flash_attn_varlen_func(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        softcap: float = 0.0,
        **kwargs,
    ) -> torch.Tensor:
        self.calls += 1
        if kwargs.get("dropout_p"):
            raise ValueError("attention dropout is not supported by the attention shim")
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
        left, right = _window(causal, window_size)
        backend = self._pick(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, scale, left, right, softcap)
        if backend == "varlen":
            return _cuda_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, left, right)
        if backend in SQUARE_KERNELS:
            return square_attention(SQUARE_KERNELS[backend], q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, scale)
        segments = Segments.from_cu(cu_seqlens_q, cu_seqlens_k)
        return sdpa_varlen(q, k, v, segments, scale, left, right, softcap or 0.0, self.dense_limit)


def compare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, scale, backends, repeats: int = 5) -> list[Trial]:
    """Each of *backends* timed and checked on one causal call (attention_compare) against fp32 SDPA per segment
    (exact, see the shim tests)."""
    shims = [VarlenAttention(b) for b in backends]
    return compare_backends(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, scale, shims,
                            VarlenAttention("sdpa", dense_limit=0), repeats)


def _cuda_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, left, right):
    varlen_attn = _torch_varlen()
    kwargs = {"scale": scale, "window_size": (left, right)}
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            kwargs["enable_gqa"] = True
        else:
            k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    out = varlen_attn(
        q,
        k,
        v,
        cu_seqlens_q.to(torch.int32),
        cu_seqlens_k.to(torch.int32),
        int(max_seqlen_q),
        int(max_seqlen_k),
        **kwargs,
    )
    return out[0] if isinstance(out, tuple) else out


# --- square segments: cuDNN (jagged nested tensors) and FlexAttention ----------------------------------------------
# Both kernels align a causal mask top-left when a segment has fewer queries than keys, FlashAttention bottom-right.
# Padding each segment's queries in front with zero rows up to its key count makes every segment square, where the two
# alignments agree; the padded rows are dropped from the output (their gradient is zero). In TRL's tree packing the
# padding is a completion's shared prompt, so the extra work is (prompt length)^2 / 2 per completion, about 1 % here.


@dataclass(frozen=True)
class SquareLayout:
    """Where each key-space row takes its query from (`len(q)` = the zero row) and where the real rows come back."""

    q_index: torch.Tensor  # (Tk,) rows of cat(q, zero row)
    out_index: torch.Tensor  # (Tq,) rows of the square output that belong to q, in q order
    segment: torch.Tensor  # (Tk,) segment of every key-space row


def square_layout(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int) -> SquareLayout:
    """Square layout of one packed call, computed on the tensors' device without a host sync."""
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_k.long()
    lens_k = cu_k[1:] - cu_k[:-1]
    pad = lens_k - (cu_q[1:] - cu_q[:-1])
    segment = torch.repeat_interleave(torch.arange(len(lens_k), device=cu_k.device), lens_k, output_size=total_k)
    pos = torch.arange(segment.numel(), device=cu_k.device) - cu_k[:-1][segment]
    real = pos >= pad[segment]
    q_index = torch.where(real, cu_q[:-1][segment] + pos - pad[segment], torch.full_like(pos, total_q))
    return SquareLayout(q_index, torch.nonzero(real).flatten(), segment)


def square_usable(q: torch.Tensor, left: int, right: int, softcap: float) -> bool:
    """Whether a square-segment kernel computes this call: CUDA fp16/bf16, plain causal (no window), no softcap."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and left < 0 and right == 0 and not softcap


def square_attention(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, scale) -> torch.Tensor:
    """Bottom-right causal varlen attention through a kernel that takes square segments (queries = keys)."""
    layout = square_layout(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0])
    q_square = torch.cat([q, q.new_zeros(1, *q.shape[1:])]).index_select(0, layout.q_index)
    out = kernel(q_square, k, v, cu_seqlens_k, layout.segment, int(max_seqlen_k), scale)
    return out.index_select(0, layout.out_index)


def cudnn_nested(q, k, v, cu_seqlens, segment, max_seqlen, scale) -> torch.Tensor:
    """Causal SDPA over square segments as jagged nested tensors, restricted to the cuDNN backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    offsets = cu_seqlens.to(torch.int64)

    def jagged(x):
        return torch.nested.nested_tensor_from_jagged(x.contiguous(), offsets, max_seqlen=max_seqlen).transpose(1, 2)

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), is_causal=True, scale=scale)
    return out.transpose(1, 2).values()


def document_block_mask(segment: torch.Tensor, padded: int, block: int = FLEX_BLOCK):
    """FlexAttention BlockMask for causal attention inside documents laid end to end, built from block tables.

    Documents are contiguous, so query block i meets key blocks from the first block of its first row's document up
    to i; a block is full (no mask evaluation) when it lies before the diagonal and both blocks sit in one document.
    """
    from torch.nn.attention.flex_attention import BlockMask

    rows = segment.numel()
    document = torch.cat([segment, segment.new_full((padded - rows,), int(segment.max()) + 1 if rows else 0)])
    starts = torch.zeros(int(document.max()) + 2, dtype=torch.long, device=document.device)
    starts.scatter_reduce_(0, document, torch.arange(padded, device=document.device), reduce="amin", include_self=False)
    first_doc, last_doc = document[::block], document[block - 1 :: block]
    blocks = torch.arange(padded // block, device=document.device)
    first_block = starts[first_doc] // block
    in_range = (blocks[None, :] >= first_block[:, None]) & (blocks[None, :] <= blocks[:, None])
    single = first_doc == last_doc
    full = in_range & (blocks[None, :] < blocks[:, None]) & (single[:, None] & single[None, :])
    full &= first_doc[:, None] == first_doc[None, :]
    partial = in_range & ~full

    def table(selected: torch.Tensor):
        order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return selected.sum(-1).to(torch.int32)[None, None], order[None, None]

    def mask_mod(b, h, q_idx, kv_idx):
        return (document[q_idx] == document[kv_idx]) & (kv_idx <= q_idx)

    return BlockMask.from_kv_blocks(*table(partial), *table(full), BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(padded, padded))


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def flex_document(q, k, v, cu_seqlens, segment, max_seqlen, scale) -> torch.Tensor:
    """Compiled FlexAttention over square segments with a block-sparse document-causal mask (rows padded to 128)."""
    rows = q.shape[0]
    padded = -(-rows // FLEX_BLOCK) * FLEX_BLOCK

    def heads_first(x):
        return F.pad(x, (0, 0, 0, 0, 0, padded - rows)).transpose(0, 1).unsqueeze(0)

    mask = document_block_mask(segment, padded)
    out = _compiled_flex()(heads_first(q), heads_first(k), heads_first(v), block_mask=mask, scale=scale,
                           enable_gqa=k.shape[1] != q.shape[1])
    return out[0].transpose(0, 1)[:rows]


SQUARE_KERNELS = {"cudnn": cudnn_nested, "flex": flex_document}


SHIM = VarlenAttention()


def fa3_unavailable_reason() -> str | None:
    """Why TRL's FlashAttention-3 kernel cannot run here, or None when it should (then TRL's lookup is kept)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not torch.version.hip:
        capability = torch.cuda.get_device_capability()
        if capability not in FA3_CAPABILITIES:
            return f"GPU compute capability sm_{capability[0]}{capability[1]} has no FlashAttention-3 build"
    if importlib.util.find_spec("kernels") is None:
        return "the `kernels` package is not installed"
    from trl.experimental.async_grpo import packing

    try:
        packing._flash_attn()
    except Exception as error:  # offline hub, untrusted publisher, missing build: all mean "not here"
        return f"FlashAttention-3 kernel could not be loaded ({type(error).__name__}: {error})"
    return None


def _shim_lookup() -> VarlenAttention:
    return SHIM


def install(mode: str = "auto", backend: str | None = None) -> str:
    """Point TRL's packed attention at the shim; returns a one-line account of what was decided.

    `on` always installs, `off` never does, `auto` installs only where FlashAttention-3 is unavailable (no CUDA,
    ARM64 or Blackwell GPUs without a build, or an offline kernels hub). TRL's `tree_attention` resolves
    `packing._flash_attn` at call time, so rebinding that module attribute is enough. `backend` (else the
    GRPO_ATTENTION_BACKEND environment variable, else the shim's current one) picks the kernel behind it.
    """
    if mode not in MODES:
        raise ValueError(f"attention_shim must be one of {', '.join(MODES)}, not {mode!r}")
    backend = backend or os.environ.get(BACKEND_ENV) or SHIM.backend
    if backend not in BACKENDS:
        raise ValueError(f"attention backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    SHIM.backend = backend
    from trl.experimental.async_grpo import packing

    if mode == "off":
        return "attention shim off: TRL's FlashAttention-3 kernel is used"
    if packing._flash_attn is _shim_lookup:
        return "attention shim already installed"
    if mode == "auto":
        reason = fa3_unavailable_reason()
        if reason is None:
            return "attention shim not installed: FlashAttention-3 is available"
    else:
        reason = "forced on"
    packing._flash_attn = _shim_lookup
    return f"attention shim installed, backend {backend} ({reason})"


def installed() -> bool:
    """Whether TRL's packed attention currently resolves to the shim."""
    from trl.experimental.async_grpo import packing

    return packing._flash_attn is _shim_lookup
