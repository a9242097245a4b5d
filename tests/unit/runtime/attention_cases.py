"""Packed-batch builders and a dense per-sample reference for the attention shim tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Packed:
    """One packed row laid out like TRL's tree packing: q rows, gathered k/v rows, segment offsets."""

    samples: list[list[int]]  # packed token indices of each full sample (prompt + completion), in order
    query_rows: list[list[int]]  # for each sample, the packed rows whose output belongs to it (first seen)
    kv_index: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    total: int


def shared_prompt_row(prompt_len: int, completion_lens: list[int], plain_lens: list[int]) -> Packed:
    """A prompt shared by several completions (q shorter than k per completion segment), then unrelated samples."""
    offsets_q, offsets_k, kv, samples, query_rows = [0], [0], [], [], []
    prompt = list(range(prompt_len))
    # Segment 0: the prompt, attending to itself.
    kv += prompt
    offsets_q.append(prompt_len)
    offsets_k.append(len(kv))
    cursor = prompt_len
    for n, length in enumerate(completion_lens):
        tokens = list(range(cursor, cursor + length))
        kv += prompt + tokens
        offsets_q.append(cursor + length)
        offsets_k.append(len(kv))
        samples.append(prompt + tokens)
        query_rows.append((prompt if n == 0 else []) + tokens)
        cursor += length
    for length in plain_lens:
        tokens = list(range(cursor, cursor + length))
        kv += tokens
        offsets_q.append(cursor + length)
        offsets_k.append(len(kv))
        samples.append(tokens)
        query_rows.append(tokens)
        cursor += length
    lens_q = [b - a for a, b in zip(offsets_q[:-1], offsets_q[1:], strict=True)]
    lens_k = [b - a for a, b in zip(offsets_k[:-1], offsets_k[1:], strict=True)]
    return Packed(
        samples=samples,
        query_rows=query_rows,
        kv_index=torch.tensor(kv, dtype=torch.long),
        cu_q=torch.tensor(offsets_q, dtype=torch.int32),
        cu_k=torch.tensor(offsets_k, dtype=torch.int32),
        max_q=max(lens_q),
        max_k=max(lens_k),
        total=cursor,
    )


def dense_reference(q, k, v, packed: Packed, scale=None, window: int | None = None, softcap: float = 0.0):
    """Plain causal attention over each whole sample in fp32, written without SDPA; returns packed (T, Hq, D)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for sample, rows in zip(packed.samples, packed.query_rows, strict=True):
        index = torch.tensor(sample, device=q.device)
        qs, ks, vs = (x.float().index_select(0, index).transpose(0, 1) for x in (q, k, v))
        ks = ks.repeat_interleave(heads // kv_heads, dim=0)
        vs = vs.repeat_interleave(heads // kv_heads, dim=0)
        scores = qs @ ks.transpose(-1, -2) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        n = len(sample)
        i = torch.arange(n, device=q.device)
        allowed = i[None, :] <= i[:, None]
        if window is not None:
            allowed &= i[:, None] - i[None, :] < window
        scores = scores.masked_fill(~allowed, float("-inf"))
        result = (torch.softmax(scores, dim=-1) @ vs).transpose(0, 1)
        positions = {token: p for p, token in enumerate(sample)}
        wanted = torch.tensor(rows, device=q.device)
        picked = torch.tensor([positions[r] for r in rows], device=q.device)
        out = out.index_copy(0, wanted, result.index_select(0, picked))
    return out


def random_qkv(total: int, heads: int, kv_heads: int, head_dim: int, dtype, device="cpu", seed: int = 0):
    """Leaf q/k/v tensors, with values representable in bf16 so fp32 and bf16 runs see identical inputs."""
    generator = torch.Generator().manual_seed(seed)
    shapes = ((total, heads, head_dim), (total, kv_heads, head_dim), (total, kv_heads, head_dim))
    tensors = [torch.randn(s, generator=generator).to(torch.bfloat16).float() for s in shapes]
    return [t.to(device=device, dtype=dtype).requires_grad_(True) for t in tensors]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Norm-wise relative error ||actual - expected|| / ||expected|| in fp32."""
    actual, expected = actual.detach().float(), expected.detach().float()
    return float((actual - expected).norm() / expected.norm())


def from_segments(kv_index: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int) -> Packed:
    """Reference layout from any tree packing: a segment's key path is a sample, its query rows the path's tail."""
    bounds_q, bounds_k, kv = cu_q.tolist(), cu_k.tolist(), kv_index.tolist()
    samples, rows = [], []
    for s in range(len(bounds_q) - 1):
        samples.append(kv[bounds_k[s] : bounds_k[s + 1]])
        rows.append(list(range(bounds_q[s], bounds_q[s + 1])))
    return Packed(samples, rows, kv_index, cu_q, cu_k, max_q, max_k, bounds_q[-1])
