"""The decision of a tune (pure, no I/O): from the baseline's repeats and one trial per knob value, what is kept and why
(issue 43; seed 004 section 7: judge by time to a reward, not by throughput alone).

Without a target reward the measure is samples trained per wall-clock hour, the reward's trend beside it. With one, a
throughput screen keeps the two best knobs, then each is judged by the estimated time its reward line (the watcher's
least-squares fit, grpo_deploy.runtime.watch.series.fit, over time and reward) takes to reach the target. Noise is the
relative range of the baseline's repeats on the same measure; a knob is kept only when its gain is beyond it, never on
a tie, never when it failed, never when it changes the objective unless that is allowed, and one value per knob at
most (the best)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from grpo_deploy.runtime.watch.series import fit

SAMPLES_PER_HOUR = "samples/h"
SCREENED = 2
"""Knobs the throughput screen passes on to be judged by time to the target."""
MIN_BASELINES = 2
"""Ok baseline repeats needed before noise is measured (and anything can be kept)."""
RISE_SE = 2.0
"""A reward line rises when its slope is at least this many standard errors above zero (one-sided, about 97.5 %):
a flat, noisy reward's line has a slope a hair above zero that would put the target days away."""


@dataclass(frozen=True)
class Trial:
    """One run of the tune: a baseline repeat (knob None) or one knob at one value, the same length, seed and data."""

    label: str
    """`baseline #1`, `packing=512`."""
    knob: str | None
    """The TuneKnob's name; None for a baseline."""
    value: Any
    ok: bool
    reason: str = ""
    """Why it failed (out of memory, a refused configuration); "" when ok."""
    steps: int = 0
    wall_s: float = 0.0
    """Wall clock from the first step's end to the last's: steps - 1 steps' time."""
    samples: int = 0
    """Samples trained over those steps (the steps after the first)."""
    rewards: tuple[tuple[int, float, float], ...] = ()
    """(step, seconds since the first step, mean reward) per step."""
    objective: str = ""
    """The knob's objective note ("" = the loss is unchanged)."""
    extra: dict = field(default_factory=dict)
    """Answer tokens/s, fwd+bwd tokens/s, peak memory ...: shown, not judged."""

    @property
    def samples_per_hour(self) -> float | None:
        return self.samples * 3600 / self.wall_s if self.ok and self.wall_s > 0 and self.samples > 0 else None

    @property
    def step_s(self) -> float | None:
        return self.wall_s / (self.steps - 1) if self.ok and self.steps > 1 and self.wall_s > 0 else None


@dataclass(frozen=True)
class Verdict:
    trial: Trial
    kept: bool
    why: str
    gain: float
    """Relative gain over the baseline's mean: samples/h over the baseline's, or the baseline's time to the target
    over the trial's, less one (0.12: 12% more samples/h, or the target reached 1.12x as fast); nan where not
    measured."""
    noise: float
    """The baseline's relative range on the same measure (inf: not measured)."""
    measure: str
    """`samples/h`, or `time to reward X`."""

    @property
    def objective_refused(self) -> bool:
        """Not kept only because it changes what the loss computes (its gain beat the noise)."""
        return not self.kept and self.trial.ok and bool(self.trial.objective) and self.why.startswith(
            "faster but changes the objective")


def _spread(values: list[float]) -> float:
    """(max - min) / mean of *values*; inf with fewer than MIN_BASELINES or a mean that is not positive."""
    if len(values) < MIN_BASELINES or statistics.fmean(values) <= 0:
        return math.inf
    return (max(values) - min(values)) / statistics.fmean(values)


def noise(baselines: list[Trial]) -> float:
    """The relative range of samples/hour between the ok baseline repeats: (max - min) / mean (|a - b| / mean for two).
    A range, not a confidence interval: two repeats give no interval worth the name (Student's t with one degree of
    freedom is 12.7). inf with fewer than two ok repeats: noise not measured, so nothing can be kept."""
    return _spread([r for t in baselines if (r := t.samples_per_hour) is not None])


def _line(trial: Trial):
    return fit([(t, r) for _, t, r in trial.rewards]) if trial.ok else None


def time_to_target(trial: Trial, target: float) -> float | None:
    """Seconds from the first step until the least-squares reward line over (seconds, reward) reaches *target*
    (extrapolated past the trial's end; 0.0 when the line starts at or above it); None when the line is not fitted
    (under 3 points) or its slope is not positive by RISE_SE standard errors."""
    line = _line(trial)
    if line is None or line.slope <= 0 or line.slope <= RISE_SE * line.se:
        return None
    mean_t = statistics.fmean(t for _, t, _ in trial.rewards)
    return max(mean_t + (target - line.mean) / line.slope, 0.0)


def reward_per_hour(trial: Trial) -> float | None:
    """The reward line's slope per wall-clock hour (None when not fitted): the trend reported beside samples/h."""
    line = _line(trial)
    return None if line is None else line.slope * 3600


def trials_that_fit(budget_s: float, trial_s: float, baselines: int = 2) -> int:
    """Knob trials that fit *budget_s* after *baselines* baseline repeats of *trial_s* each; 0 when not even the
    baselines fit."""
    if trial_s <= 0:
        raise ValueError(f"a trial takes a positive time, not {trial_s}")
    return max(int(budget_s // trial_s) - baselines, 0)


def judge(baselines: list[Trial], trials: list[Trial], target: float | None,
          allow_objective_change: bool) -> list[Verdict]:
    """One verdict per trial of *trials* (in their order) against the repeated *baselines*: by samples/h without a
    *target*; with one, the two knobs whose best value has the most samples/h are judged by time to the target (the
    rest are screened out). A trial is kept when its gain is beyond the noise, it did not fail, its knob leaves the
    objective unchanged or *allow_objective_change*, and no other value of its knob gains more."""
    sph_noise = noise(baselines)
    base_sph = [r for t in baselines if (r := t.samples_per_hour) is not None]
    base = statistics.fmean(base_sph) if base_sph else None
    first = [_throughput(trial, base, base_sph) for trial in trials]  # (gain, words) on throughput, per trial
    if target is None or math.isinf(sph_noise):  # no repeats to measure noise by: nothing to screen for
        verdicts = [_judged(t, *first[i], sph_noise, SAMPLES_PER_HOUR, allow_objective_change)
                    for i, t in enumerate(trials)]
    else:
        verdicts = _by_target(baselines, trials, target, first, sph_noise, allow_objective_change)
    return _one_per_knob(verdicts)


def _throughput(trial: Trial, base: float | None, base_sph: list[float]) -> tuple[float, str]:
    sph = trial.samples_per_hour
    if sph is None or base is None:
        return math.nan, ""
    trend = reward_per_hour(trial)
    words = f"{sph:,.0f} samples/h against the baseline's {base:,.0f} ({len(base_sph)} repeats)"
    return sph / base - 1, words + ("" if trend is None else f"; reward {trend:+.3f}/h")


def _judged(trial: Trial, gain: float, words: str, spread: float, measure: str, allow: bool) -> Verdict:
    """The verdict on one measured trial, in the order of the rules: failed, unmeasured, noise, tie or slower,
    objective."""
    if not trial.ok:
        return Verdict(trial, False, f"failed: {trial.reason or 'no reason given'}", math.nan, spread, measure)
    shown = words if math.isnan(gain) else f"{gain:+.1%} {measure} ({words})" if measure == SAMPLES_PER_HOUR \
        else f"{1 + gain:.2f}x as fast to {measure.removeprefix('time to ')} ({words})"
    if math.isinf(spread):
        return Verdict(trial, False, f"noise not measured (fewer than {MIN_BASELINES} ok baseline repeats): nothing "
                       f"can be kept" + (f"; {shown}" if shown else ""), gain, spread, measure)
    if math.isnan(gain):
        return Verdict(trial, False, f"{measure} not measured for this trial", gain, spread, measure)
    words = shown
    if abs(gain) <= spread:
        return Verdict(trial, False, f"tie: {words} is within the baseline's noise of {spread:.1%}", gain, spread,
                       measure)
    if gain < 0:
        return Verdict(trial, False, f"slower: {words}, beyond the noise of {spread:.1%}", gain, spread, measure)
    if trial.objective and not allow:
        return Verdict(trial, False, f"faster but changes the objective ({trial.objective}): {words}; kept only when "
                       "objective changes are allowed", gain, spread, measure)
    note = f"; it changes the objective ({trial.objective}), which was allowed" if trial.objective else ""
    return Verdict(trial, True, f"kept: {words}, beyond the noise of {spread:.1%}{note}", gain, spread, measure)


def _by_target(baselines: list[Trial], trials: list[Trial], target: float, first: list[tuple[float, str]],
               sph_noise: float, allow: bool) -> list[Verdict]:
    """The throughput screen (the best value of each knob, the SCREENED best knobs), then time to *target*."""
    best: dict[str, int] = {}
    for i, trial in enumerate(trials):
        gain = first[i][0]
        if trial.ok and not math.isnan(gain) and (trial.knob not in best or gain > first[best[trial.knob]][0]):
            best[trial.knob] = i
    screened = set(sorted(best.values(), key=lambda i: first[i][0], reverse=True)[:SCREENED])
    times = [time_to_target(t, target) for t in baselines if t.ok]
    measured = [t for t in times if t is not None]
    base_time = statistics.fmean(measured) if measured and len(measured) == len(times) else None
    time_noise = _spread(measured) if base_time else math.inf  # 0.0: the baseline starts at the target
    verdicts = []
    for i, trial in enumerate(trials):
        gain, words = first[i]
        if trial.ok and i in screened:
            verdicts.append(_timed(trial, target, base_time, time_noise, words, allow))
            continue
        v = _judged(trial, gain, words, sph_noise, SAMPLES_PER_HOUR, allow)
        why = v.why if not trial.ok else f"screened out on throughput (not among the {SCREENED} best knobs): {v.why}"
        verdicts.append(Verdict(trial, False, why, v.gain, v.noise, v.measure))
    return verdicts


def _timed(trial: Trial, target: float, base_time: float | None, spread: float, words: str, allow: bool) -> Verdict:
    """The verdict on a screened trial by its estimated time to *target* against the baseline's mean time."""
    measure = f"time to reward {target:g}"
    if not base_time:
        return Verdict(trial, False, f"the baseline's reward line does not rise to {target:g} in every repeat (or "
                       f"starts there): {measure} not measured; {words}", math.nan, math.inf, measure)
    took = time_to_target(trial, target)
    if took is None:
        return Verdict(trial, False, f"its reward line does not rise: {measure} not measured; {words}", math.nan,
                       spread, measure)
    speedup = base_time / took - 1 if took > 0 else math.inf
    return _judged(trial, speedup, f"{took:,.0f} s against the baseline's {base_time:,.0f} s; {words}", spread,
                   measure, allow)


def _one_per_knob(verdicts: list[Verdict]) -> list[Verdict]:
    """At most one kept value per knob: the one with the largest gain; the others say which was kept instead."""
    kept: dict[str, Verdict] = {}
    for v in verdicts:
        if v.kept and (v.trial.knob not in kept or v.gain > kept[v.trial.knob].gain):
            kept[v.trial.knob] = v
    out = []
    for v in verdicts:
        winner = kept.get(v.trial.knob)
        if v.kept and winner is not v:
            v = Verdict(v.trial, False, f"{winner.trial.label} gains more: {v.why.removeprefix('kept: ')}", v.gain,
                        v.noise, v.measure)
        out.append(v)
    return out
