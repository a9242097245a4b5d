"""The kit on one GPU, for real: the harness renders a trl-async spec for this machine's one-GPU profile, starts vLLM
and the trainer from the rendered files as processes (both on GPU 0), trains and reports (grpo_deploy.harness).

Run on a GPU machine with vLLM and TRL importable (`make test-gpu`); deselected elsewhere (-m 'not gpu'). Two trials in
one harness run, the server started once per distinct server config: the rehearsal task (40 steps) and seed 004's
recipe shape at 1,300-token answers (20 steps, the profile's speed switches on). The reports land in
$GRPO_GPU_OUT (default: pytest's tmp folder) as report.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    if not torch.cuda.is_available():
        pytest.fail("marked gpu: needs a CUDA device (deselect with -m 'not gpu')")
    from grpo_deploy import harness

    out = Path(os.environ.get("GRPO_GPU_OUT") or tmp_path_factory.mktemp("harness"))
    trials = [harness.parse_trial("rehearsal:40"), harness.parse_trial("seed004:20:1300:on")]
    done = harness.run(trials, out, ready_timeout=900, trial_timeout=1500)
    assert json.loads((out / "report.json").read_text())["trials"] == done
    return {r["shape"]: r for r in done}


def test_rehearsal_task_trains_on_the_gpu(reports):
    r = reports["rehearsal"]
    assert r["trainer_exit"] == 0 and r["steps"] == 40, r
    assert r["reward_last5"] > r["reward_first5"] + 0.1, r  # the brevity reward rises, as on CPU
    assert r["adapter_loads_ok"] >= 40 and r["adapter_loads_failed"] == 0, r  # weight_sync_steps 1
    assert 0.9 <= r["ratio_min"] <= r["ratio_max"] <= 1.1, r


def test_seed004_shape_runs_its_recipe_on_one_gpu(reports):
    r = reports["seed004"]
    assert r["trainer_exit"] == 0 and r["steps"] == 20, r
    assert r["adapter_loads_failed"] == 0 and r["adapter_loads_ok"] >= 20 // 4, r  # weight_sync_steps 4
    assert 120 <= r["samples_per_step"] <= 140, r  # 8 answers x 16 prompts, packed rows of 16,384 tokens
    assert r["answer_length_median"] >= 0.95 * 1300, r  # a random-weight model runs to the cap
    assert r["mfu_fwd_bwd"] and r["mfu_fwd_bwd"] > 0.2, r  # TRL's own MFU inside the loop, switches on


def test_seed004_importance_ratio_stays_near_one_in_bf16(reports):
    """Seed 004 saw 0.9976-1.002 over its run; a wider band is a finding to explain, so the bound here is loose only
    by the noise of 20 steps of a random-weight model (its token distribution is flat, the hardest case for bf16)."""
    r = reports["seed004"]
    assert 0.98 <= r["ratio_min"] <= r["ratio_max"] <= 1.02, r


def test_both_roles_share_the_gpu_within_its_memory(reports):
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    for r in reports.values():
        assert 0 < r["server_peak_gib"] and 0 < r["trainer_peak_gib"], r
        assert r["server_peak_gib"] + r["trainer_peak_gib"] <= total_gib, (r, total_gib)
