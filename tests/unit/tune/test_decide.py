"""Tests of grpo_deploy.tune.decide: the tune's decision over trial streams, a real one (the CPU rehearsal's 40 steps,
tests/unit/metrics/cpu_rehearsal.jsonl) and constructed ones: noise larger than the gain, a tie, a faster knob that
changes the objective, a failed trial, too few baselines, one value per knob, a budget that fits one trial, and with a
target reward, time to the target ranking a knob with more samples/h but a flatter reward below one that gets there
sooner."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpo_deploy.common.metrics import read_events
from grpo_deploy.tune.decide import Trial, judge, noise, reward_per_hour, time_to_target, trials_that_fit

RECORDED = Path(__file__).parents[1] / "metrics" / "cpu_rehearsal.jsonl"
WALL = 3600.0
STEPS = 20


def _trial(label: str, sph: float, knob: str | None = None, value=None, slope_h: float = 0.5, start: float = 0.1,
           objective: str = "", ok: bool = True, reason: str = "") -> Trial:
    """A trial of STEPS steps over an hour training *sph* samples, its reward a line of *slope_h* per hour from
    *start* with a +-0.01 zigzag (a line fit has residuals to work with)."""
    times = [WALL * k / (STEPS - 1) for k in range(STEPS)]
    rewards = tuple((k + 1, t, start + slope_h * t / 3600 + (0.01 if k % 2 else -0.01)) for k, t in enumerate(times))
    return Trial(label, knob, value, ok, reason, STEPS, WALL if ok else 0.0, int(sph) if ok else 0,
                 rewards if ok else (), objective)


def _recorded(scale: float = 1.0, label: str = "baseline #1") -> Trial:
    """The real CPU rehearsal as a trial: wall clock from its first step to its last (x *scale*: a repeat that ran
    that much slower), the samples of the steps after the first."""
    steps = [e for e in read_events(str(RECORDED)) if e.get("event") == "step"]
    t0 = steps[0]["time"]
    rewards = tuple((e["step"], (e["time"] - t0) * scale, e["reward"]) for e in steps)
    samples = int(sum(e["batch/samples_per_step"] for e in steps[1:]))
    return Trial(label, None, None, True, steps=len(steps), wall_s=(steps[-1]["time"] - t0) * scale, samples=samples,
                 rewards=rewards)


def _by_label(verdicts):
    return {v.trial.label: v for v in verdicts}


def test_samples_per_hour_and_step_time_of_the_real_rehearsal():
    t = _recorded()
    assert t.steps == 40 and t.samples == 39 * 16
    assert t.samples_per_hour == pytest.approx(624 * 3600 / 403.82, rel=1e-3)
    assert t.step_s == pytest.approx(403.82 / 39, rel=1e-3)
    assert reward_per_hour(t) > 0  # the rehearsal's reward rises (0.02 -> 0.65)
    failed = _trial("x", 1000, ok=False, reason="OOM")
    assert failed.samples_per_hour is None and failed.step_s is None


def test_noise_is_the_relative_range_of_the_ok_baselines():
    assert noise([_trial("b1", 900), _trial("b2", 1100)]) == pytest.approx(0.2)
    assert noise([_trial("b1", 900), _trial("b2", 1100), _trial("b3", 1000)]) == pytest.approx(0.2)
    assert noise([_trial("b1", 900), _trial("b2", 1100, ok=False, reason="killed")]) == math.inf
    slower = 1 / 1.05  # a repeat 5 % slower trains 1/1.05 of the samples an hour
    assert noise([_recorded(), _recorded(1.05, "baseline #2")]) == pytest.approx((1 - slower) / ((1 + slower) / 2))


def test_a_gain_smaller_than_the_noise_is_not_kept():
    baselines = [_recorded(), _recorded(1.25, "baseline #2")]  # a repeat 25 % slower: noise ~22 %
    faster = _recorded(1 / 1.05, "inflight=16")  # 5 % faster than the first repeat: +16.7 % over their mean
    faster = Trial(faster.label, "inflight", 16, True, steps=faster.steps, wall_s=faster.wall_s,
                   samples=faster.samples, rewards=faster.rewards)
    (v,) = judge(baselines, [faster], None, False)
    assert not v.kept and v.gain == pytest.approx(1.05 / 0.9 - 1) and v.noise == pytest.approx(0.2 / 0.9)
    assert v.why.startswith("tie:") and v.measure == "samples/h"
    quiet = [_recorded(), _recorded(1.02, "baseline #2")]  # the same trial against quiet repeats is kept
    (v,) = judge(quiet, [faster], None, False)
    assert v.kept and v.why.startswith("kept:") and "reward +" in v.why


def test_a_tie_is_not_kept_and_a_slower_knob_is_named_slower():
    wide = [_trial("baseline #1", 1000), _trial("baseline #2", 3000)]  # mean 2000, noise exactly 1.0
    (tie,) = judge(wide, [_trial("sync-every=4", 4000, "sync-every", 4)], None, False)
    assert not tie.kept and tie.gain == tie.noise == 1.0 and tie.why.startswith("tie:")  # equal to the noise: a tie
    baselines = [_trial("baseline #1", 900), _trial("baseline #2", 1100)]  # mean 1000, noise 0.2
    (slow,) = judge(baselines, [_trial("vllm-memory=0.2", 700, "vllm-memory", 0.2)], None, False)
    assert not slow.kept and slow.gain == pytest.approx(-0.3) and slow.why.startswith("slower:")


def test_a_faster_knob_that_changes_the_objective_is_kept_only_when_allowed():
    baselines = [_trial("baseline #1", 1000), _trial("baseline #2", 1010)]
    packing = _trial("packing=512", 1500, "packing", 512, objective="per-token instead of per-answer weighting")
    (v,) = judge(baselines, [packing], None, False)
    assert not v.kept and v.gain > v.noise and "changes the objective" in v.why and "per-token" in v.why
    assert v.objective_refused
    (v,) = judge(baselines, [packing], None, True)
    assert v.kept and "which was allowed" in v.why and not v.objective_refused
    (slow,) = judge(baselines, [_trial("packing=512", 900, "packing", 512, objective="per-token")], None, False)
    assert not slow.kept and not slow.objective_refused  # slower: refused for its speed, not its objective


def test_a_failed_trial_is_reported_with_its_reason_and_not_kept():
    baselines = [_trial("baseline #1", 1000), _trial("baseline #2", 1010)]
    (v,) = judge(baselines, [_trial("packing=32768", 0, "packing", 32768, ok=False, reason="CUDA out of memory")],
                 None, True)
    assert not v.kept and v.why == "failed: CUDA out of memory" and math.isnan(v.gain)


def test_without_two_ok_baselines_nothing_is_kept():
    baselines = [_trial("baseline #1", 1000), _trial("baseline #2", 0, ok=False, reason="server died")]
    for target in (None, 0.6):
        (v,) = judge(baselines, [_trial("compile=True", 3000, "compile", True)], target, True)
        assert not v.kept and v.why.startswith("noise not measured") and v.noise == math.inf
        assert v.gain == pytest.approx(2.0)  # still shown


def test_at_most_one_value_per_knob_is_kept_the_best():
    baselines = [_trial("baseline #1", 1000), _trial("baseline #2", 1010)]
    verdicts = _by_label(judge(baselines, [_trial("inflight=16", 1300, "inflight", 16),
                                           _trial("inflight=32", 1500, "inflight", 32),
                                           _trial("staleness=4", 1200, "staleness", 4)], None, False))
    assert verdicts["inflight=32"].kept and verdicts["staleness=4"].kept
    assert not verdicts["inflight=16"].kept and verdicts["inflight=16"].why.startswith("inflight=32 gains more")


def test_trials_that_fit_after_the_baselines():
    assert trials_that_fit(3 * 600, 600) == 1  # two baselines and one trial
    assert trials_that_fit(3 * 600 - 1, 600) == 0
    assert trials_that_fit(1000, 600) == 0  # not even the baselines
    assert trials_that_fit(3600, 600, baselines=3) == 3
    with pytest.raises(ValueError):
        trials_that_fit(3600, 0)


def test_time_to_target_follows_the_fitted_reward_line():
    line = Trial("t", None, None, True, steps=4, wall_s=300.0, samples=40,
                 rewards=tuple((k, 100.0 * k, 0.1 + 0.001 * 100 * k) for k in range(4)))
    assert time_to_target(line, 0.5) == pytest.approx(400.0)  # past the trial's end: extrapolated
    assert time_to_target(line, 0.05) == 0.0  # the line starts above it
    flat = _trial("flat", 1000, slope_h=0.0)
    assert time_to_target(flat, 0.5) is None
    falling = _trial("falling", 1000, slope_h=-0.2, start=0.5)
    assert time_to_target(falling, 0.6) is None
    assert time_to_target(Trial("two", None, None, True, rewards=((1, 0.0, 0.1), (2, 1.0, 0.2))), 0.5) is None


def test_with_a_target_time_to_it_ranks_a_steeper_knob_above_a_faster_flatter_one():
    baselines = [_trial("baseline #1", 1000, slope_h=0.50), _trial("baseline #2", 1020, slope_h=0.52)]
    fast_flat = _trial("packing=512", 1500, "packing", 512, slope_h=0.30)
    steep = _trial("staleness=4", 1200, "staleness", 4, slope_h=1.00)
    slow = _trial("vllm-memory=0.2", 900, "vllm-memory", 0.2, slope_h=2.0)  # screened out on throughput
    assert fast_flat.samples_per_hour > steep.samples_per_hour
    assert time_to_target(fast_flat, 0.6) > time_to_target(steep, 0.6)
    verdicts = _by_label(judge(baselines, [fast_flat, steep, slow], 0.6, False))
    assert verdicts["staleness=4"].kept and verdicts["staleness=4"].measure == "time to reward 0.6"
    assert verdicts["staleness=4"].gain == pytest.approx(1.0 / 0.51 - 1, rel=0.05)  # ~ twice as fast to 0.6
    assert not verdicts["packing=512"].kept and verdicts["packing=512"].why.startswith("slower:")
    assert verdicts["packing=512"].measure == "time to reward 0.6"
    assert not verdicts["vllm-memory=0.2"].kept and verdicts["vllm-memory=0.2"].why.startswith("screened out")
    # without the target the same streams are judged by throughput: the flatter knob wins there
    by_throughput = _by_label(judge(baselines, [fast_flat, steep], None, False))
    assert by_throughput["packing=512"].kept and by_throughput["packing=512"].gain > by_throughput["staleness=4"].gain


def test_a_target_the_baseline_never_rises_to_keeps_nothing():
    baselines = [_trial("baseline #1", 1000, slope_h=-0.05), _trial("baseline #2", 1010, slope_h=0.0)]
    (v,) = judge(baselines, [_trial("staleness=4", 1500, "staleness", 4, slope_h=1.0)], 0.6, False)
    assert not v.kept and "baseline's reward line does not rise" in v.why
