"""Test helper: a spec from `grpo-deploy init`'s output with keys changed through YAML (not by editing its text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from grpo_deploy import spec
from grpo_deploy.spec import new_spec
from tests.testhosts import SHARED_DIR


def spec_data(profile: str = "gb10", engine: str = "trl-async", hosts=("a", "b"), **changes: Any) -> dict:
    """init's spec as data, with *changes* applied: dotted keys (`checkpoints__keep` or "checkpoints.keep" via
    `**{"checkpoints.keep": 3}`), list items by index (`hosts.0.gpus`)."""
    return changed(yaml.safe_load(new_spec.spec_text(profile, engine, list(hosts))), **changes)


def changed(data: dict, **changes: Any) -> dict:
    """*data* with *changes* applied (the dotted keys of spec_data)."""
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


def split_spec(path: Path, run: str = "split", **changes: Any) -> Path:
    """The cpu rehearsal split over two SSH test hosts, spark1 (trainer) and spark2 (server), sharing the test hosts'
    shared directory, written to *path* with *changes* applied last."""
    data = spec_data("cpu", "trl-async", ("spark1", "spark2"))
    data["run"]["name"] = run
    data["storage"]["nfs"] = None
    for host in data["hosts"]:
        host["shared_dir"] = SHARED_DIR
    path.write_text(yaml.safe_dump(changed(data, **changes), sort_keys=False))
    return path


def spec_yaml(*args, **changes: Any) -> str:
    return yaml.safe_dump(spec_data(*args, **changes), sort_keys=False)


def loaded(*args, **changes: Any) -> spec.LoadedSpec:
    return spec.loads(spec_yaml(*args, **changes), source="spec.yaml")
