"""One harness run per test module of tests/gpu (grpo_deploy.harness), on the machine's one GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def run_harness(tmp_path_factory, name: str, trials: list[str]) -> dict[str, dict]:
    """Run *trials* once; the reports by trial name. $GRPO_GPU_OUT/<name> keeps the report and the work tree."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.fail("marked gpu: needs a CUDA device (deselect with -m 'not gpu')")
    from grpo_deploy import harness

    root = os.environ.get("GRPO_GPU_OUT")
    out = Path(root) / name if root else tmp_path_factory.mktemp(name)
    done = harness.run([harness.parse_trial(t) for t in trials], out, ready_timeout=900, trial_timeout=1500)
    assert json.loads((out / "report.json").read_text())["trials"] == done
    return {r["trial"]: r for r in done}
