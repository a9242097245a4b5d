"""tune/loop.py, the tuner's procedure without its trials: the side's candidate plans on top of kept knobs, the
interleaved baselines, and the whole loop on recorded trials (run_trial replaced by a player of recorded outcomes
through the loop's own seam: the trials themselves are tested for real in tests/integration/test_tune.py)."""

from __future__ import annotations

import pytest

from grpo_deploy.spec.resolve import resolve
from grpo_deploy.tune import loop
from grpo_deploy.tune.decide import Trial
from grpo_deploy.tune.trials import TrialPlan
from tests.specs import loaded


@pytest.fixture(scope="module")
def cpu_res():
    return resolve(loaded("cpu", "trl-async", ()))


def _baseline(i: int) -> TrialPlan:
    return TrialPlan(f"baseline 1.{i}")


@pytest.mark.parametrize("count", [0, 1, 2, 3, 5, 8])
def test_the_order_holds_at_least_two_baselines_spread_among_the_knob_trials(count):
    plans = [TrialPlan(f"k={i}", "k", i) for i in range(count)]
    order = loop.interleave(plans, _baseline, have=1)
    baselines = [p for p in order if p.knob is None]
    assert [p for p in order if p.knob is not None] == plans  # every knob trial once, in its order
    assert len(baselines) + 1 >= loop.MIN_BASELINES  # with the round's first
    assert [p.label for p in baselines] == [f"baseline 1.{i}" for i in range(2, 2 + len(baselines))]
    if count >= 2:
        assert order[-1].knob is None or order.index(baselines[0]) < len(order) - 1  # not all bunched at one end
        assert order[0].knob is not None  # the first baseline ran already: a knob comes next


def test_candidates_are_the_sides_knobs_on_top_of_the_kept_ones(cpu_res):
    trainer = loop.candidate_plans(cpu_res, "trainer", None, {})
    assert trainer and all(cpu_res.engine_info.knob(p.knob).side == "trainer" for p in trainer)
    every = loop.candidate_plans(cpu_res, None, None, {})
    assert set(p.label for p in trainer) < set(p.label for p in every)
    first = trainer[0]
    setting = cpu_res.engine_info.knob(first.knob).setting
    on_top = loop.candidate_plans(cpu_res, None, None, {setting: (first.value, first.label)})
    assert all(p.knob != first.knob for p in on_top)  # a kept knob is not tried again
    assert all(p.changes[0] == (setting, first.value) for p in on_top)  # every later trial carries it


def test_only_the_allowed_knobs_are_planned_whatever_side_diagnose_names(cpu_res):
    plans = loop.candidate_plans(cpu_res, None, ("packing",), {})
    assert plans and {p.knob for p in plans} == {"packing"}
    named = loop.candidate_plans(cpu_res, "trainer", ("inflight",), {})  # a generation knob, named by the user
    assert {p.knob for p in named} == {"inflight"}


def _trial(label, knob=None, value=None, samples=1000, ok=True, reason="") -> Trial:
    rewards = tuple((s, s * 3.0, 0.1 + 0.02 * s) for s in range(1, 13))
    return Trial(label, knob, value, ok, reason, steps=12, wall_s=36.0, samples=samples, rewards=rewards)


def test_the_loop_keeps_a_knob_beyond_the_noise_and_reports_a_faster_one_that_changes_the_objective(
        cpu_res, monkeypatch, tmp_path):
    """Recorded outcomes: baselines at 1,000 and 1,010 samples a trial, max_inflight_tasks 16 at 1,600, packing at
    1,700 (faster, but it changes what the loss computes), every other knob at the baselines' rate."""
    played = []

    def player(plan, data, res, folder, ssh_args, progress=None, timeout_s=3600):
        played.append(plan.label)
        samples = {"inflight": 1600, "packing": 1700}.get(plan.knob, 1010 if len(played) % 2 else 1000)
        if any(setting == "overrides.trl.max_inflight_tasks" for setting, _v in plan.changes) and plan.knob is None:
            samples = 1600  # round 2's baselines carry the kept knob
        events = [{"event": "step", "step": s, "time": 100.0 + 3 * s, "reward": 0.1 + 0.02 * s} for s in range(1, 13)]
        return _trial(plan.label, plan.knob, plan.value, samples, objective=plan.objective), events

    monkeypatch.setattr(loop, "run_trial", player)
    lines = []
    request = loop.TuneRequest(budget_s=3600, target=None, knobs=None, steps=12)
    result = loop.tune(_user(), cpu_res, request, tmp_path, [], trial_s_forecast=10, say=lines.append)
    assert played[0] == "baseline 1.1" and "packing=512" in played and "inflight=16" in played
    first_round = played[:played.index("baseline 2.1")]
    assert sum(p.startswith("baseline 1.") for p in first_round) >= 1 + -(-(len(first_round) - 1) // 4)
    assert any(line.startswith("round 1: diagnose says") for line in lines)
    assert result.kept == {"overrides.trl.max_inflight_tasks": (16, "inflight=16")}, result.stopped
    packing = next(v for v in result.verdicts if v.trial.label == "packing=512")
    assert not packing.kept and "objective" in packing.why, packing.why
    assert "inflight=16" not in played[played.index("baseline 2.1"):]  # a kept knob is not tried again
    assert result.stopped == "no knob's gain was beyond the measured noise"


def test_a_failed_baseline_stops_the_tune_with_its_reason(cpu_res, monkeypatch, tmp_path):
    def player(plan, data, res, folder, ssh_args, progress=None, timeout_s=3600):
        return _trial(plan.label, ok=False, reason="error: preflight failed: disk"), []

    monkeypatch.setattr(loop, "run_trial", player)
    result = loop.tune(_user(), cpu_res, loop.TuneRequest(3600, None, None, 12), tmp_path, [], 10, lambda _l: None)
    assert result.stopped == "the baseline failed: error: preflight failed: disk" and len(result.trials) == 1


def test_the_budget_stops_before_a_trial_that_would_not_fit(cpu_res, monkeypatch, tmp_path):
    monkeypatch.setattr(loop, "run_trial", lambda *a, **k: pytest.fail("no trial fits"))
    result = loop.tune(_user(), cpu_res, loop.TuneRequest(60, None, None, 12), tmp_path, [], 120, lambda _l: None)
    assert result.trials == [] and result.stopped.startswith("the budget: 1 min left")


def _trial(label, knob=None, value=None, samples=1000, ok=True, reason="", objective="") -> Trial:
    rewards = tuple((s, s * 3.0, 0.1 + 0.02 * s) for s in range(1, 13))
    return Trial(label, knob, value, ok, reason, steps=11, wall_s=33.0, samples=samples, rewards=rewards,
                 objective=objective)


def _user() -> dict:
    import yaml

    from grpo_deploy.spec import new_spec

    return yaml.safe_load(new_spec.spec_text("cpu", "trl-async", []))
