"""The rehearsal's task on one GPU, both roles on it: the kit's render for this machine's one-GPU profile, vLLM and
the trainer started from the rendered files as the images start them (grpo_deploy.harness), 40 steps."""

from __future__ import annotations

import pytest

from tests.gpu.conftest import assert_roles_within_the_card, run_harness

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return run_harness(tmp_path_factory, "rehearsal", ["rehearsal:40"])["gpu-rehearsal-on"]


def test_rehearsal_task_trains_on_the_gpu(report):
    assert report["trainer_exit"] == 0 and report["steps"] == 40, report
    assert report["reward_last5"] > report["reward_first5"] + 0.1, report  # the brevity reward rises, as on CPU


def test_every_adapter_load_is_answered(report):
    assert report["adapter_loads_ok"] >= 40 and report["adapter_loads_failed"] == 0, report  # weight_sync_steps 1


def test_importance_ratio_near_one(report):
    assert 0.9 <= report["ratio_min"] <= report["ratio_max"] <= 1.1, report


def test_both_roles_hold_gpu_memory_within_the_card(report):
    assert_roles_within_the_card(report)
