"""FLOP counts and MFU of one GRPO + LoRA forward/backward over packed rows (pure arithmetic, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

# Dense bf16 tensor-core peaks, FLOP/s. NVIDIA's H100/H200 SXM datasheets give 1,979 TFLOP/s bf16 "with sparsity",
# i.e. 989 TFLOP/s dense; TRL 1.16 uses the same values (trl/trainer/utils.py `_PEAK_FLOPS_BY_DEVICE`, after
# TorchTitan). More specific names come first, as in TRL's table.
PEAK_BF16 = (
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("A100", 312e12),
)


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs from a decoder-only transformer's config."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config) -> ModelShape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                   config.num_key_value_heads, head_dim, config.intermediate_size, config.vocab_size)

    @property
    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of one decoder layer's linear layers: q, k, v, o, gate, up, down."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    @property
    def layer_params(self) -> int:
        """Weights of every decoder layer's linear layers (biases and norms are below 0.1 % and left out)."""
        return self.layers * sum(a * b for a, b in self.linear_shapes)

    @property
    def head_params(self) -> int:
        """The LM head's matrix (tied to the embedding or not, it is one hidden x vocab product per scored token)."""
        return self.hidden * self.vocab

    def lora_params(self, rank: int) -> int:
        """LoRA A and B of rank `rank` on every decoder linear layer (all-linear; TRL refuses a LoRA on lm_head)."""
        return self.layers * sum(rank * (a + b) for a, b in self.linear_shapes)


@dataclass(frozen=True)
class Work:
    """Token counts of what was forwarded and trained, and the (query, key) pairs causal attention evaluated."""

    forwarded: int  # unique tokens through the decoder (tree packing forwards a shared prompt once)
    trained: int  # loss terms: completion tokens scored by the fused LM head
    pairs: int  # attended (query, key) pairs summed over segments, causal and bottom-right aligned


def causal_pairs(cu_seqlens_q: list[int], cu_seqlens_k: list[int]) -> int:
    """(query, key) pairs a bottom-right causal varlen call evaluates: Lq*(Lk-Lq) + Lq*(Lq+1)/2 per segment."""
    total = 0
    for q0, q1, k0, k1 in zip(cu_seqlens_q[:-1], cu_seqlens_q[1:], cu_seqlens_k[:-1], cu_seqlens_k[1:], strict=True):
        lq, lk = q1 - q0, k1 - k0
        total += lq * (lk - lq) + lq * (lq + 1) // 2
    return total


def attention_flops(heads: int, head_dim: int, pairs: int) -> int:
    """Forward FLOPs of one attention call: QK^T and PV, 2 FLOPs per multiply-add, per query head."""
    return 2 * 2 * heads * head_dim * pairs


def model_flops(shape: ModelShape, work: Work) -> int:
    """Conventional fwd+bwd model FLOPs, the "6 x params x tokens" of MFU plus attention (3x its forward).

    Decoder weights count for every forwarded token, the LM head only for scored tokens (the fused head projects
    only those). Gradient-checkpointing recomputation is not counted: MFU counts the model's FLOPs, not the GPU's.
    """
    attention = 3 * shape.layers * attention_flops(shape.heads, shape.head_dim, work.pairs)
    return 6 * shape.layer_params * work.forwarded + 6 * shape.head_params * work.trained + attention


def lora_flops(shape: ModelShape, work: Work, rank: int) -> int:
    """The fwd+bwd FLOPs LoRA training really executes: frozen weights need no weight gradient, so their backward is
    one product (input gradient), 4 x params x tokens in all instead of 6; attention's backward is unchanged (2x its
    forward); the adapters themselves cost the full 6 x params x tokens."""
    frozen = 4 * shape.layer_params * work.forwarded + 4 * shape.head_params * work.trained
    attention = 3 * shape.layers * attention_flops(shape.heads, shape.head_dim, work.pairs)
    return frozen + attention + 6 * shape.lora_params(rank) * work.forwarded


def trl_flops(shape: ModelShape, work: Work, samples: int) -> int:
    """TRL 1.16's own count (`compute_flops_per_token`, the `perf/mfu_fwd_bwd` metric seed 004 quotes): 3 x forward
    with the LM head on every forwarded token and non-causal attention over the mean forwarded sample length."""
    seq_len = work.forwarded // max(samples, 1)
    attn = 2 * shape.hidden * (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    attn += 2 * shape.heads * shape.head_dim * shape.hidden + 4 * shape.heads * shape.head_dim * seq_len
    mlp = 6 * shape.hidden * shape.intermediate
    per_token = 3 * (shape.layers * (attn + mlp) + 2 * shape.vocab * shape.hidden)
    return per_token * work.forwarded


def peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak of a GPU by its name, or None when it is not in the table (then MFU is not reported)."""
    for name, peak in PEAK_BF16:
        if name.casefold() in device_name.casefold():
            return peak
    return None


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation in percent."""
    return 100.0 * flops / seconds / peak
