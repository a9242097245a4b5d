"""The tuner's procedure (`grpo-deploy tune`), in the order Hugging Face and seed 004 followed by hand: a baseline
trial of the user's spec; `diagnose` on it names the side that bounds the run; that side's knobs (the engine's
TuneKnob table) tried one value at a time, each trial as long as the others, from the same seed and data; the
baseline repeated between them (at least twice in all, interleaved) so the noise is measured, not assumed; a knob
kept only when tune.decide finds its gain beyond that noise; then, with the kept knobs as the new baseline, once more.
It stops at the budget, when no knob helps, or at Ctrl-C, and returns what it measured either way."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_deploy.spec.resolve import Resolved
from grpo_deploy.tune import decide
from grpo_deploy.tune.decide import Trial, Verdict
from grpo_deploy.tune.trials import TrialPlan, check_trial, run_trial, trial_data

ROUNDS = 2  # diagnose, try the side's knobs, keep; then once more from the kept knobs
MIN_BASELINES = 2  # the noise needs two baselines at least
TEARDOWN_S = 15.0  # what a trial costs beyond its forecast (down, metrics read back)


@dataclass(frozen=True)
class TuneRequest:
    """What the user asked (validated by the CLI): budget, target reward, the knobs allowed, the trial length."""

    budget_s: float
    target: float | None
    knobs: tuple[str, ...] | None  # None: every knob of the diagnosed side
    steps: int
    allow_objective_change: bool = False


@dataclass
class TuneResult:
    """Every trial run, the verdicts of every round's judgement, the knobs kept (setting -> (value, label)), the side
    each round's diagnosis named, and why the tuner stopped."""

    trials: list[Trial] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    kept: dict[str, tuple[Any, str]] = field(default_factory=dict)
    sides: list[str] = field(default_factory=list)
    stopped: str = ""
    interrupted: bool = False


def knob_side(res: Resolved, diagnosis_side: str) -> str | None:
    """The knob side (trainer, generation, weight-sync) that the engine's diagnosis side maps to; None: every side
    (a balanced run, or too little data to say)."""
    return res.engine_info.tune_sides.get(diagnosis_side)


def candidate_plans(res: Resolved, side: str | None, allowed: tuple[str, ...] | None,
                    kept: dict[str, tuple[Any, str]]) -> list[TrialPlan]:
    """One plan per (knob, value) of the side's knobs (every side's with None), or of the *allowed* knobs whatever
    their side (the user named them), on top of the knobs already kept (whose own setting is not tried again)."""
    base = tuple((setting, value) for setting, (value, _label) in kept.items())
    plans = []
    for knob in res.engine_info.tune_knobs:
        if (allowed is not None and knob.name not in allowed) or (allowed is None and side is not None
                                                                     and knob.side != side):
            continue
        if knob.setting in kept:
            continue
        for value in knob.candidates(res):
            plans.append(TrialPlan(f"{knob.name}={value}", knob.name, value, (*base, (knob.setting, value)),
                                   knob.objective))
    return plans


def interleave(plans: list[TrialPlan], baseline: Callable[[int], TrialPlan], have: int) -> list[TrialPlan]:
    """The round's order after its first baseline: knob trials with the baseline repeated between them so that at
    least MIN_BASELINES baselines exist and each third of the knobs has one beside it."""
    extra = max(MIN_BASELINES - have, -(-len(plans) // 3))  # at least one beside every three knob trials
    if not plans:
        return [baseline(have + i + 1) for i in range(extra)]
    out, every = [], max(1, -(-len(plans) // extra))  # a baseline after each `every` knob trials
    for i, plan in enumerate(plans):
        out.append(plan)
        if (i + 1) % every == 0 and sum(p.knob is None for p in out) < extra:
            out.append(baseline(have + 1 + sum(p.knob is None for p in out)))
    while sum(p.knob is None for p in out) < extra:
        out.append(baseline(have + 1 + sum(p.knob is None for p in out)))
    return out


def tune(user: dict, res: Resolved, request: TuneRequest, folder: Path, ssh_args: list[str],
         trial_s_forecast: float, say: Callable[[str], None]) -> TuneResult:
    """Run the procedure; *say* gets one line per trial. *trial_s_forecast*: the forecast of one trial (the budget
    check before the first); each trial's real duration replaces it from then on."""
    result = TuneResult()
    began = time.monotonic()
    per_trial = trial_s_forecast
    kept: dict[str, tuple[Any, str]] = {}
    number = 0

    def left() -> float:
        return request.budget_s - (time.monotonic() - began)

    def one(plan: TrialPlan) -> tuple[Trial, list[dict]] | None:
        nonlocal number, per_trial
        if left() < per_trial:
            result.stopped = f"the budget: {left() / 60:.0f} min left, a trial takes ~{per_trial / 60:.1f} min"
            return None
        number += 1
        run_name = f"{res.spec.run.name}-tune-{number}"[:63]
        data = trial_data(user, res, plan, run_name, request.steps)
        try:
            trial_res = check_trial(data, f"tune trial {number} ({plan.label})")
        except ValueError as exc:  # SpecError: the knob's value is refused by the spec's rules
            trial = Trial(plan.label, plan.knob, plan.value, False, f"refused: {str(exc).splitlines()[0][:240]}",
                          objective=plan.objective)
            result.trials.append(trial)
            say(f"trial {number} {plan.label}: refused by the spec's rules ({trial.reason})")
            return trial, []
        started = time.monotonic()
        trial, events = run_trial(plan, data, trial_res, folder / f"trial-{number}", ssh_args)
        per_trial = max(per_trial * 0.5, time.monotonic() - started + TEARDOWN_S)
        result.trials.append(trial)
        say(trial_line(number, trial, left()))
        return trial, events

    try:
        for round_no in range(1, ROUNDS + 1):
            first = one(TrialPlan(f"baseline {round_no}.1", changes=_kept_changes(kept)))
            if first is None:
                break
            baseline, events = first
            if not baseline.ok:
                result.stopped = f"the baseline failed: {baseline.reason}"
                break
            diagnosis, _labels = res.engine_info.diagnose(events, res)
            result.sides.append(diagnosis.side)
            plans = candidate_plans(res, knob_side(res, diagnosis.side), request.knobs, kept)
            which = "of --knobs" if request.knobs is not None else "for that side"
            say(f"round {round_no}: diagnose says {diagnosis.side}; {len(plans)} knob trial(s) {which}")
            if not plans:
                result.stopped = f"no knob left to try for the {diagnosis.side} side"
                break
            order = interleave(plans, lambda i, r=round_no: TrialPlan(f"baseline {r}.{i}", changes=_kept_changes(kept)),
                               have=1)
            ran = [baseline]
            for plan in order:
                got = one(plan)
                if got is None:
                    break
                ran.append(got[0])
            baselines = [t for t in ran if t.knob is None]
            verdicts = decide.judge(baselines, [t for t in ran if t.knob is not None], request.target,
                                    request.allow_objective_change)
            result.verdicts += verdicts
            newly = {_setting(res, v.trial.knob): (v.trial.value, v.trial.label) for v in verdicts if v.kept}
            if not newly:
                result.stopped = result.stopped or "no knob's gain was beyond the measured noise"
                break
            kept.update(newly)
            if result.stopped:
                break
        else:
            result.stopped = f"{ROUNDS} rounds done"
    except KeyboardInterrupt:
        result.interrupted, result.stopped = True, "Ctrl-C: the trial in progress was stopped"
    result.kept = kept
    return result


def _kept_changes(kept: dict[str, tuple[Any, str]]) -> tuple[tuple[str, Any], ...]:
    return tuple((setting, value) for setting, (value, _label) in kept.items())


def _setting(res: Resolved, knob_name: str | None) -> str:
    return next(k.setting for k in res.engine_info.tune_knobs if k.name == knob_name)


def trial_line(number: int, trial: Trial, left_s: float) -> str:
    """One progress line: the trial, its steps and measure so far, the budget left."""
    if not trial.ok:
        return f"trial {number} {trial.label}: FAILED ({trial.reason}); {max(left_s, 0) / 60:.0f} min left"
    rewards = [r for _s, _t, r in trial.rewards]
    trend = f", reward {rewards[0]:.3f} -> {rewards[-1]:.3f}" if len(rewards) >= 2 else ""
    step = "-" if trial.step_s is None else f"{trial.step_s:.2f}"
    rate = "-" if trial.samples_per_hour is None else f"{trial.samples_per_hour:,.0f}"
    return (f"trial {number} {trial.label}: {trial.steps} steps, {step} s/step, {rate} samples/h{trend}; "
            f"{max(left_s, 0) / 60:.0f} min left")
