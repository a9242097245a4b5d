"""A model's shape: the spec's `model.architecture` schema and the sizes plan and the engines derive from it
(parameters, LoRA parameters, KV bytes per token), and the shapes the kit knows by model (grpo_deploy/models.yaml).
Imports nothing of the kit but the strict base and value types, so the spec, plan and the engine modules alike may
read it."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Annotated, Any

import yaml
from pydantic import ConfigDict, Field

from grpo_deploy.common.strict import Strict
from grpo_deploy.common.values import Count

Dim = Annotated[Count, Field(le=2**24)]


class ArchitectureSpec(Strict):
    """A model's shape (its config.json), for plan's memory and checkpoint estimates."""

    # As every spec model (grpo_deploy.spec.schema._Strict): not frozen, an assignment validated like a loaded value.
    model_config = ConfigDict(frozen=False, validate_assignment=True)

    hidden_size: Dim
    intermediate_size: Dim
    num_hidden_layers: Dim
    num_attention_heads: Dim
    num_key_value_heads: Dim
    vocab_size: Dim
    tie_word_embeddings: bool = True
    head_dim: Dim | None = None


class Architecture(ArchitectureSpec):
    """A model's shape (the spec's type) and the sizes plan derives from it."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Architecture:
        return cls(**{k: d[k] for k in cls.model_fields if k in d})

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder block (Qwen2/Llama layout)."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.num_attention_heads * self.hd, \
            self.num_key_value_heads * self.hd
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def params(self) -> int:
        per_layer = sum(a * b for a, b in self.linear_shapes().values()) + 2 * self.hidden_size
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return per_layer * self.num_hidden_layers + embed + self.hidden_size

    def lora_params(self, r: int, target_modules: Any = "all-linear") -> int:
        shapes = self.linear_shapes()
        if target_modules not in ("all-linear", None):
            names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
            shapes = {k: v for k, v in shapes.items() if k in names}
        return r * sum(a + b for a, b in shapes.values()) * self.num_hidden_layers

    def kv_bytes_per_token(self) -> int:
        """K and V of every layer, in 2-byte (bf16/fp16) elements."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.hd * 2


@cache
def known_models() -> dict[str, dict[str, Any]]:
    """grpo_deploy/models.yaml: the shape of each model plan knows, by its path (a hub id or a path in the images)."""
    return yaml.safe_load((resources.files("grpo_deploy") / "models.yaml").read_text(encoding="utf-8"))
