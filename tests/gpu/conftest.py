"""One harness run per test module of tests/gpu (grpo_deploy.harness), on the machine's one GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def run_harness(tmp_path_factory, name: str, trials: list[str]) -> dict[str, dict]:
    """Run *trials* once; the reports by trial name. $GRPO_GPU_OUT/<name> keeps the report and the work tree;
    $GRPO_GPU_TRIAL_TIMEOUT bounds a trial, $GRPO_GPU_VLLM_ARGS adds vLLM arguments (e.g. --enforce-eager)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.fail("marked gpu: needs a CUDA device (deselect with -m 'not gpu')")
    from grpo_deploy import harness

    root = os.environ.get("GRPO_GPU_OUT")
    out = Path(root) / name if root else tmp_path_factory.mktemp(name)
    timeout = float(os.environ.get("GRPO_GPU_TRIAL_TIMEOUT", "1500"))  # a device call's limit is shorter
    extra = tuple(filter(None, os.environ.get("GRPO_GPU_VLLM_ARGS", "").split()))
    done = harness.run([harness.parse_trial(t) for t in trials], out, ready_timeout=900, trial_timeout=timeout,
                       vllm_args=extra)
    assert json.loads((out / "report.json").read_text())["trials"] == done
    return {r["trial"]: r for r in done}


def assert_roles_within_the_card(report: dict) -> None:
    """Both roles held GPU memory, and together no more than the card has."""
    import torch

    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    assert 0 < report["server_peak_gib"] and 0 < report["trainer_peak_gib"], report
    assert report["server_peak_gib"] + report["trainer_peak_gib"] <= total_gib, (report, total_gib)
