"""Test helper: a spec from `grpo-deploy init`'s output with keys changed through YAML (not by editing its text)."""

from __future__ import annotations

from typing import Any

import yaml

from grpo_deploy import new_spec, spec


def spec_data(profile: str = "gb10", engine: str = "trl-async", hosts=("a", "b"), **changes: Any) -> dict:
    """init's spec as data, with *changes* applied: dotted keys (`checkpoints__keep` or "checkpoints.keep" via
    `**{"checkpoints.keep": 3}`), list items by index (`hosts.0.gpus`)."""
    data = yaml.safe_load(new_spec.spec_text(profile, engine, list(hosts)))
    for dotted, value in changes.items():
        *parents, last = dotted.replace("__", ".").split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


def spec_yaml(*args, **changes: Any) -> str:
    return yaml.safe_dump(spec_data(*args, **changes), sort_keys=False)


def loaded(*args, **changes: Any) -> spec.LoadedSpec:
    return spec.loads(spec_yaml(*args, **changes), source="spec.yaml")
