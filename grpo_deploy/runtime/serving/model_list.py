"""What a vLLM server's `GET /v1/models` answer says, read as input: its entries (id -> parent, bounded) and the base
model's served name. One reading for the replica proxy's failpoint and the trainer's served-policy check."""

from __future__ import annotations

from typing import Any

from grpo_deploy.runtime.storage.adapters import POLICY_PREFIX

MAX_ENTRIES, MAX_NAME = 10_000, 1024


def entries(answer: Any) -> dict[str, str | None] | None:
    """The parsed answer's models as {id: parent}, entries that are not vLLM's shape left out; None when the answer
    holds no model list at all."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        return None
    out: dict[str, str | None] = {}
    for entry in data[:MAX_ENTRIES]:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and len(entry["id"]) <= MAX_NAME:
            parent = entry.get("parent")
            out[entry["id"]] = parent if isinstance(parent, str) and len(parent) <= MAX_NAME else None
    return out


def base_of(models: dict[str, str | None], adapter: str | None = None) -> str | None:
    """The base model's served name: *adapter*'s listed parent, else the one listed name that is no adapter."""
    parent = models.get(adapter) if adapter is not None else None
    if parent is not None and parent in models:
        return parent
    bases = [name for name, parent in models.items() if parent is None and not name.startswith(POLICY_PREFIX)]
    return bases[0] if len(bases) == 1 else parent
