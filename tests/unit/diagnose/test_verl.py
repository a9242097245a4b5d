"""grpo_deploy.diagnose.verl: the bound phase of a verl step and the seed-000 knobs, from a real verl rehearsal's
events (tests/unit/metrics/verl-rehearsal-cpu.jsonl: `make test-verl`, 2 cores, a head kill at step 8 and the
resume) and from streams that change one phase."""

from __future__ import annotations

import copy
from pathlib import Path

from grpo_deploy.common.metrics import read_events
from grpo_deploy.diagnose import verl as diagnose_verl
from grpo_deploy.diagnose.base import diagnosis_text

RECORDED = Path(__file__).parents[1] / "metrics" / "verl-rehearsal-cpu.jsonl"
CPU_HINT = {"rollout_tp": 1, "gpu_memory_utilization": 0.2, "rollout_n": 4, "ppo_mini_batch_size": 4,
            "train_batch_size": 4, "ppo_micro_batch_size_per_gpu": 4, "log_prob_micro_batch_size_per_gpu": 4}


def test_the_real_rehearsal_is_generation_bound_and_names_the_seed_knob():
    d = diagnose_verl.diagnose(read_events(str(RECORDED)), CPU_HINT)
    assert d.side == "generation-bound", d
    assert d.evidence["generation_share"] > 0.5 and d.evidence["steps"] >= 16
    assert d.evidence["reward_last"] > d.evidence["reward_first"]
    assert [k.setting for k in d.next_knobs] == ["overrides.verl.actor_rollout_ref.rollout.gpu_memory_utilization"]
    text = diagnosis_text(d, diagnose_verl.LABELS)
    assert "generation share of step" in text and "seed 000" in text


def test_an_update_bound_stream_names_the_batch_knobs():
    events = copy.deepcopy(read_events(str(RECORDED)))
    for e in events:
        if e["event"] == "step":
            e["timing_s/update_actor"] = e["timing_s/step"] * 0.8
    d = diagnose_verl.diagnose(events, CPU_HINT)
    assert d.side == "actor update-bound"
    assert [k.value for k in d.next_knobs] == ["8"]  # micro-batch doubled; mini-batch is already the batch


def test_tp_and_n_above_the_seed_are_named_first():
    hint = {**CPU_HINT, "rollout_tp": 4, "rollout_n": 10, "gpu_memory_utilization": 0.8}
    d = diagnose_verl.diagnose(read_events(str(RECORDED)), hint)
    assert [k.setting.rsplit(".", 1)[1] for k in d.next_knobs] == ["tensor_model_parallel_size", "n"]


def test_too_few_steps_and_missing_timings_say_so():
    steps = [e for e in read_events(str(RECORDED)) if e["event"] == "step"][:4]
    assert diagnose_verl.diagnose(steps, CPU_HINT).side == "not enough data"
    bare = [{k: v for k, v in e.items() if not k.startswith("timing_s/") or k == "timing_s/step"}
            for e in read_events(str(RECORDED))]
    d = diagnose_verl.diagnose(bare, CPU_HINT)
    assert d.side == "not enough data" and any("timing_s/gen" in m for m in d.not_recorded)
