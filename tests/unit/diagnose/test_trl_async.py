"""Tests of grpo_deploy.diagnose.trl_async: recorded metric streams (tests/unit/metrics/, provenance at the top of
each file) -> the bottleneck side, the evidence figures and the first knob."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_deploy.common.metrics import read_events
from grpo_deploy.diagnose import trl_async as diagnose
from grpo_deploy.diagnose.base import diagnosis_text
from grpo_deploy.spec import new_spec, resolve
from tests import specs

METRICS = Path(__file__).parents[1] / "metrics"

# The settings each recorded run used (what the events cannot say), as `diagnose.settings_hint` gives them.
SPARK_BASELINE = {"queue_maxsize": 512, "max_inflight_tasks": 128, "max_num_seqs": 128, "weight_sync_steps": 4,
                  "token_budget": 0, "gradient_checkpointing": True, "trainer_memory_gb": 128}  # HF recipe on a GB10
H200_BEFORE_RUN5 = {"queue_maxsize": 512, "max_inflight_tasks": 128, "max_num_seqs": 256, "weight_sync_steps": 4,
                    "token_budget": 16384, "gradient_checkpointing": False, "trainer_memory_gb": 141}
H200_SYNC_EVERY_STEP = {"queue_maxsize": 768, "max_inflight_tasks": 384, "max_num_seqs": 384, "weight_sync_steps": 1,
                        "token_budget": 16384, "gradient_checkpointing": False, "trainer_memory_gb": 141}


def _events(name: str) -> list[dict]:
    return read_events(str(METRICS / f"{name}.jsonl"))


def _without(events: list[dict], key: str) -> list[dict]:
    return [{k: v for k, v in e.items() if k != key} for e in events]


# (a) seed 004's Spark baseline ------------------------------------------------------------------------------------
def test_spark_baseline_is_trainer_bound_with_the_seeds_figures():
    d = diagnose.diagnose(_events("spark_trainer_bound"), SPARK_BASELINE)
    ev = d.evidence
    assert d.side == "trainer-bound"
    assert ev["steps"] == 48
    assert ev["step_time_median_s"] == pytest.approx(79.3, abs=1.0)  # seed: median step 79.3 s
    assert 0.88 <= ev["fwd_bwd_share"] <= 0.92  # seed: "about 90% of every step"
    assert ev["queue_cap"] == 512 and ev["queue_fill_frac"] >= 0.9  # seed: "near its cap of 512"
    assert ev["rollout_wait_share"] < 0.01 and ev["backpressure_steps_frac"] == 1.0
    assert ev["backpressure_s_mean"] == pytest.approx(20, abs=1)  # seed: ~20 s per step blocked on a full queue
    assert ev["weight_sync_median_s"] == pytest.approx(0.31, abs=0.03) and ev["weight_sync_share"] < 0.01
    assert ev["staleness_mean"] == pytest.approx(1.6, abs=0.1) and ev["dropped_stale_total"] == 0
    assert 0.012 < ev["reward_gain_per_hour"] < 0.04  # seed: 0.143 -> 0.413 in 10 h 54 min = 0.025 per hour
    assert ev["trained_tok_s"] == pytest.approx(1744, rel=0.03)  # seed Table 3: answer tokens trained per second
    assert ev["samples_per_hour"] == pytest.approx(128 * 3600 / 79.3, rel=0.02)
    assert ev["completion_length_first"] == pytest.approx(1350, abs=40) and ev["packing"] is False
    assert [k.setting for k in d.next_knobs] == ["overrides.trl.token_budget", "overrides.trl.gradient_checkpointing",
                                                 "hosts[].gpus.trainer"]
    assert d.next_knobs[0].value == "16384"
    assert "if memory allows" in d.next_knobs[1].value and "128 GB" in d.next_knobs[1].why
    assert d.next_knobs[2].value == "2 GPUs (one trainer process each)"  # a Spark: one GPU, one process
    assert "give another host the trainer role" in d.next_knobs[2].why  # seed 004's next experiment
    assert any("max_inflight_tasks" in n and "not now" in n for n in d.notes)
    assert d.not_recorded == []


def test_after_packing_the_next_knob_is_checkpointing_then_more_gpus():
    packed = diagnose.diagnose(_events("spark_trainer_bound"), {**SPARK_BASELINE, "token_budget": 16384})
    assert packed.side == "trainer-bound" and packed.next_knobs[0].setting == "overrides.trl.gradient_checkpointing"
    tuned = diagnose.diagnose(_events("spark_trainer_bound"),
                              {**SPARK_BASELINE, "token_budget": 16384, "gradient_checkpointing": False})
    assert [k.setting for k in tuned.next_knobs] == ["hosts[].gpus.trainer"]


def test_the_queue_near_its_cap_decides_alone():
    d = diagnose.diagnose(_without(_events("spark_trainer_bound"), "rollout/backpressure_s"), SPARK_BASELINE)
    assert d.side == "trainer-bound" and "the rollout queue sat at 96% of its cap" in d.reason
    assert "blocked" not in d.reason and d.evidence["backpressure_steps_frac"] == 0


def test_without_the_queue_cap_backpressure_decides_and_the_cap_is_named_missing():
    d = diagnose.diagnose(_events("spark_trainer_bound"))
    assert d.side == "trainer-bound" and "queue cap not given" in d.reason
    assert d.evidence["queue_fill_frac"] is None and d.evidence["packing"] is False  # no batch/row_fill_frac logged
    assert d.next_knobs[0].setting == "overrides.trl.token_budget"
    assert "peak memory is not recorded" in d.next_knobs[1].why
    assert any(m.startswith("queue cap (overrides.trl.queue_maxsize") for m in d.not_recorded)


def test_a_missing_metric_is_named_not_guessed():
    d = diagnose.diagnose(_without(_events("spark_trainer_bound"), "perf/fwd_bwd_s"), SPARK_BASELINE)
    assert d.side == "not enough data" and d.next_knobs == []
    assert d.evidence["fwd_bwd_share"] is None
    assert any(m.startswith("perf/fwd_bwd_s") for m in d.not_recorded)
    assert "not recorded:\n  - perf/fwd_bwd_s" in diagnosis_text(d, diagnose.LABELS)


def test_step_time_falls_back_to_the_sinks_timestamps_and_says_so():
    d = diagnose.diagnose(_without(_events("spark_trainer_bound"), "perf/step_s"), SPARK_BASELINE)
    assert d.side == "trainer-bound"
    assert d.evidence["step_time_median_s"] == pytest.approx(79.3, abs=1.0)
    assert d.not_recorded[0].startswith("perf/step_s (step time taken from the metrics file's timestamps")


def test_a_half_full_queue_with_no_waiting_and_no_blocking_is_balanced():
    events = [{**e, "sample/rollout_queue_size": 256.0} if e["event"] == "step" else e
              for e in _without(_events("spark_trainer_bound"), "rollout/backpressure_s")]
    d = diagnose.diagnose(events, SPARK_BASELINE)
    assert d.side == "balanced" and d.next_knobs == [] and "queue 50% of cap" in d.reason
    assert d.evidence["backpressure_steps_frac"] == 0  # TRL pushes backpressure only when the worker blocks


# (b) generation-bound -----------------------------------------------------------------------------------------------
def test_h200_before_the_third_replica_is_generation_bound():
    d = diagnose.diagnose(_events("h200_generation_bound"), H200_BEFORE_RUN5)
    ev = d.evidence
    assert d.side == "generation-bound"
    assert 0.35 <= ev["rollout_wait_share"] <= 0.5 and ev["rollout_wait_s_mean"] == pytest.approx(5.5, abs=0.3)
    assert ev["queue_fill_frac"] < 0.01 and ev["backpressure_steps_frac"] == 0
    assert ev["fwd_bwd_share"] < 0.5  # fwd/bwd 4.6 s (seed) of a ~11 s step
    assert ev["weight_sync_median_s"] == pytest.approx(8.5, abs=0.3) and ev["weight_sync_share"] < 0.25
    assert ev["packing"] is True and ev["mfu_fwd_bwd"] == pytest.approx(0.19, abs=0.01)
    assert ev["staleness_mean"] == pytest.approx(2.0, abs=0.1)
    first = d.next_knobs[0]
    assert (first.setting, first.value) == ("overrides.trl.max_inflight_tasks", "256")
    assert "126 in flight of 128" in first.why
    assert d.next_knobs[-1].setting.startswith("hosts[].replicas") and d.next_knobs[-1].value.endswith(" replicas")
    assert any("per-token" in n for n in d.notes)


def test_generation_bound_raises_max_num_seqs_with_the_inflight_cap():
    d = diagnose.diagnose(_events("h200_generation_bound"), {**H200_BEFORE_RUN5, "max_num_seqs": 128})
    assert [(k.setting, k.value) for k in d.next_knobs[:2]] == [
        ("overrides.trl.max_inflight_tasks", "256"), ("overrides.vllm.max_num_seqs", "256")]


def test_generation_bound_below_the_inflight_cap_skips_raising_it():
    d = diagnose.diagnose(_events("h200_generation_bound"), {**H200_BEFORE_RUN5, "max_inflight_tasks": 384})
    assert [k.setting for k in d.next_knobs] == ["overrides.vllm.max_num_seqs",
                                                 "hosts[].replicas (or another host with roles [server])"]
    assert d.next_knobs[0].value == "384"


# (c) sync-bound -----------------------------------------------------------------------------------------------------
def test_syncing_every_step_through_a_bucket_is_sync_bound():
    d = diagnose.diagnose(_events("h200_sync_bound"), H200_SYNC_EVERY_STEP)
    ev = d.evidence
    assert d.side == "sync-bound"
    assert ev["weight_syncs"] == 40 and ev["weight_sync_median_s"] == pytest.approx(8.5, abs=0.3)
    assert ev["weight_sync_share"] == pytest.approx(8.5 / (4.8 + 8.5), abs=0.03)
    assert ev["rollout_wait_share"] < 0.01 and ev["dropped_stale_total"] == 16
    assert (d.next_knobs[0].setting, d.next_knobs[0].value) == ("overrides.trl.weight_sync_steps", "4")
    assert d.next_knobs[1].setting == "storage.nfs"
    assert any("16 samples were dropped as stale" in n for n in d.notes)


# (d) too few steps --------------------------------------------------------------------------------------------------
def test_too_few_steps_is_not_enough_data():
    d = diagnose.diagnose(_events("spark_too_few_steps"), SPARK_BASELINE)
    assert d.side == "not enough data" and d.next_knobs == []
    assert d.evidence["steps"] == 4 and "3 timed steps" in d.reason


def test_no_events_at_all():
    d = diagnose.diagnose([])
    assert d.side == "not enough data" and d.evidence["steps"] == 0
    assert diagnosis_text(d, diagnose.LABELS).startswith("diagnosis: not enough data")


# a real stream --------------------------------------------------------------------------------------------------
def test_the_cpu_rehearsal_stream_is_trainer_bound_by_backpressure():
    """The queue looks 42% full only because the trainer drains stale samples before it samples the queue's size;
    the worker blocked on the full queue in most steps and the trainer hardly waited: trainer-bound."""
    events = _events("cpu_rehearsal")
    steps = [e for e in events if e["event"] == "step"]
    timed = [e for e in steps if "perf/step_s" in e]
    # recorded when the cpu profile's rollout buffer was 16 (it is 8 since TRL's scoring queue is bounded)
    hint = {**diagnose.settings_hint(resolve.resolve(new_spec.embedded_default())), "queue_maxsize": 16}
    d = diagnose.diagnose(events, hint)
    ev = d.evidence
    assert d.side == "trainer-bound" and d.not_recorded == []  # every key the rules read is in our step events
    assert ev["steps"] == 40 and len(timed) == 39
    assert ev["step_time_median_s"] == round(sorted(e["perf/step_s"] for e in timed)[19], 4)
    share = sum(e["perf/fwd_bwd_s"] for e in timed) / sum(e["perf/step_s"] for e in timed)
    assert ev["fwd_bwd_share"] == round(share, 4) and share > diagnose.FWD_BWD_DOMINATES
    assert ev["queue_cap"] == 16 and ev["queue_fill_frac"] < diagnose.QUEUE_NEAR_CAP
    blocked = sum("rollout/backpressure_s" in e for e in steps) / len(steps)
    assert ev["backpressure_steps_frac"] == round(blocked, 3) and blocked >= diagnose.BACKPRESSURE_MOST_STEPS
    assert ev["rollout_wait_share"] < diagnose.WAIT_BOUND_SHARE
    assert ev["weight_syncs"] == 40 and ev["dropped_stale_total"] == sum(
        e.get("sample/dropped_stale_total", 0) for e in steps) > 0
    assert ev["reward_last"] > ev["reward_first"] and ev["reward_gain_per_hour"] > 0
    assert ev["completion_length_last"] < ev["completion_length_first"]  # the brevity reward shortens answers
    assert "blocked on a full queue" in d.reason
    assert d.next_knobs[0].setting == "overrides.trl.token_budget"  # packing is off on the cpu profile
    # checkpointing is already off; on the CPU the next knob is a second trainer process (gloo)
    assert [(k.setting, k.value) for k in d.next_knobs][1:] == [("overrides.runtime.trainer_processes", "2")]
    assert any("dropped as stale" in n for n in d.notes)


# output -------------------------------------------------------------------------------------------------------------
def test_text_and_json():
    d = diagnose.diagnose(_events("spark_trainer_bound"), SPARK_BASELINE)
    text = diagnosis_text(d, diagnose.LABELS)
    assert text.splitlines()[0] == "diagnosis: trainer-bound"
    assert "1. overrides.trl.token_budget: 16384" in text and "queue fill vs cap" in text
    assert "reward gain per wall-clock hour" in text and "mean completion length" in text
    data = json.loads(json.dumps(d.to_dict()))
    assert data["side"] == "trainer-bound" and data["next_knobs"][0]["setting"] == "overrides.trl.token_budget"
    assert set(data) == {"side", "reason", "evidence", "next_knobs", "not_recorded", "notes"}
    assert data["side"] in diagnose.SIDES


def test_settings_hint_from_resolved_specs():
    cpu = diagnose.settings_hint(resolve.resolve(new_spec.embedded_default()))
    assert cpu == {"queue_maxsize": 8, "max_inflight_tasks": 8, "max_num_seqs": 32, "weight_sync_steps": 1,
                   "token_budget": 0, "gradient_checkpointing": False, "trainer_processes": 1,
                   "trainer_processes_per_host": 1, "trainer_machines": 1,
                   "device": "cpu"}  # 0 GB per GPU on cpu: no memory figure
    gb10 = diagnose.settings_hint(resolve.resolve(specs.loaded("gb10", "trl-async", ("a", "b"))))
    assert gb10["queue_maxsize"] == 512 and gb10["trainer_memory_gb"] == 128 and gb10["token_budget"] == 16384
    auto = diagnose.settings_hint(resolve.resolve(specs.loaded(
        "gb10", "trl-async", ("a", "b"), **{"overrides.trl.max_inflight_tasks": -1})))
    assert auto["max_inflight_tasks"] == 4 * 1 * 12  # TRL's auto: max_staleness x batch x accumulation x 1 process
    two = resolve.resolve(specs.loaded("gb10", "trl-async", ("a", "b"), **{"overrides.trl.max_inflight_tasks": -1}))
    assert diagnose.settings_hint(two, processes=2)["max_inflight_tasks"] == 4 * 1 * 12 * 2  # TRL counts every rank


# (f) the trainer's speed switches (issue 24): a CUDA trainer that leaves them off is told what bench trainer measured
OFF = {"compile_layers": False, "lora_elementwise": False, "base_dtype": "fp32"}


def test_a_cuda_trainer_without_compile_is_told_to_compile_right_after_packing():
    d = diagnose.diagnose(_events("spark_trainer_bound"), {**SPARK_BASELINE, "speed": OFF})
    assert [k.setting for k in d.next_knobs] == ["overrides.trl.token_budget", "overrides.runtime.compile_layers",
                                                 "overrides.trl.gradient_checkpointing", "hosts[].gpus.trainer"]
    assert "5.73 -> 3.16 s" in d.next_knobs[1].why and "H200 only" in d.next_knobs[1].why


def test_with_compile_on_the_remaining_switches_are_named_and_all_on_names_none():
    half = diagnose.diagnose(_events("spark_trainer_bound"),
                             {**SPARK_BASELINE, "speed": {**OFF, "compile_layers": True}})
    assert [k.setting for k in half.next_knobs][1:3] == ["overrides.runtime.lora_elementwise",
                                                         "overrides.runtime.base_dtype"]
    done = diagnose.diagnose(_events("spark_trainer_bound"), {
        **SPARK_BASELINE, "speed": {"compile_layers": True, "lora_elementwise": True, "base_dtype": "bf16"}})
    assert not any(k.setting.startswith("overrides.runtime.") for k in done.next_knobs)


def test_the_hint_carries_the_switches_for_cuda_trainers_only():
    h200 = diagnose.settings_hint(resolve.resolve(specs.loaded("h200", "trl-async", ("a", "b"))))
    assert h200["speed"] == {"compile_layers": True, "lora_elementwise": True, "base_dtype": "bf16"}
    assert "speed" not in diagnose.settings_hint(resolve.resolve(new_spec.embedded_default()))


def test_the_next_trainer_process_is_counted_per_trainer_host():
    """Two trainer hosts of 2 processes each: the next knob is a third process on each, not a fifth rank."""
    res = resolve.resolve(specs.loaded("cpu", "trl-async", ("a", "b"), **{
        "hosts.0.roles": ["trainer", "server"], "hosts.1.roles": ["trainer"],
        "overrides.runtime": {"trainer_processes": 2}}))
    hint = diagnose.settings_hint(res, processes=4, machines=2)
    assert (hint["trainer_processes"], hint["trainer_processes_per_host"], hint["trainer_machines"]) == (4, 2, 2)
    events = read_events(str(Path(__file__).parents[1] / "metrics" / "spark_trainer_bound.jsonl"))
    found, _labels = res.engine_info.diagnose(events, res)
    knob = found.next_knobs[-1]
    assert (knob.setting, knob.value) == ("overrides.runtime.trainer_processes", "3")
    assert "on each of the 2 trainer hosts" in knob.why


# (e) a real GPU run's own metrics ----------------------------------------------------------------------------------
def test_one_h200_run_reads_mfu_as_trl_logs_it():
    """tests/unit/metrics/h200_one_gpu_seed004.jsonl: seed 004's recipe shape on one H200, both roles on it (the GPU
    harness, 2026-12-06). TRL 1.16 logs `perf/mfu_fwd_bwd` as a percentage (39.6); read as a fraction it showed as
    3,961 % until that run."""
    d = diagnose.diagnose(_events("h200_one_gpu_seed004"))
    ev = d.evidence
    assert ev["mfu_fwd_bwd"] == pytest.approx(0.396, abs=0.005)
    assert "MFU (fwd/bwd)" in diagnosis_text(d, diagnose.LABELS) and "39.6%" in diagnosis_text(d, diagnose.LABELS)
    assert ev["steps"] == 20 and ev["step_time_median_s"] == pytest.approx(6.98, abs=0.05)


def test_a_run_fed_by_its_start_up_backlog_is_generation_bound():
    """The same H200 run: its 20 steps trained from the 755 rollouts queued while the trainer started (queue 755 -> 8,
    wait ~0, 6.98 s a step; step 20, the queue empty, took 22.9 s). vLLM needs ~12.7 s to generate a step's trained
    tokens: the run is generation-bound, and its steady step is that, not 6.98 s (the H100 run showed 12.0)."""
    d = diagnose.diagnose(_events("h200_one_gpu_seed004"))
    ev = d.evidence
    assert ev["fed_by_startup_backlog"] is True and d.side == "generation-bound", d.reason
    assert ev["generation_floor_s"] == pytest.approx(12.7, abs=0.2)
    assert ev["sustained_step_s"] == ev["generation_floor_s"]
    assert "queued while it started" in d.reason and "755.7 -> 8.5" in d.reason
    assert any(k.setting == "overrides.trl.max_inflight_tasks" for k in d.next_knobs)


def test_a_steady_run_is_not_called_backlog_fed():
    d = diagnose.diagnose(_events("cpu_rehearsal"))
    assert d.evidence["fed_by_startup_backlog"] is False and d.side == "trainer-bound"
    assert d.evidence["sustained_step_s"] == pytest.approx(d.evidence["step_time_median_s"], abs=0.01)
