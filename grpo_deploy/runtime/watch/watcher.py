"""The run watcher's core: from the trainer's own metric stream, it flags a flat reward (and validation), answers
running into the length cap, length drift, KL and importance ratio out of band, staleness drops, a changed loss
normalisation and a server that serves the base model instead of the newest adapter (reported by the trainer's
served-policy check, runtime/trainer/served_policy.py, or on verl by runtime/verl/rollout_check.py, through
`served_policy()`), and keeps the trend figures status and summary show (time to target, GPU-hours after the
plateau).

Pure: no I/O, no torch. The engine's callback feeds it one `observe()` per logged step and acts on what it returns;
`replay()` warms it up from the run's metrics events on a resume. Findings are edge-triggered: one warning when a
condition starts, one "clear" when it ends.

The statistics (the plateau's line, the stretch it spans at the reward's noise, its bounds) are series.py's; the
settings types config.py's. docs/MEASUREMENTS.md ("The run watcher's alarms") has the false-alarm rate and the
detection delay across per-step noise 0.02-0.12.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_deploy.runtime.watch.config import CAP_SHARE_AUTO, WatchConfig
from grpo_deploy.runtime.watch.series import MIN_POINTS, RECENT, Fit, Plateau, Series, t_upper

# A level warning clears once the recent mean is back inside this share of its bound (hysteresis against flapping).
CLEAR_MARGIN = 0.8
# Step durations kept for the median seconds per step.
DURATIONS_KEPT = 2048


@dataclass(frozen=True)
class Finding:
    kind: str
    level: Literal["warn", "stop", "clear"]
    step: int
    message: str
    values: dict[str, float | int | str | None] = field(default_factory=dict)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _g(value: Any) -> str:
    return f"{value:.3g}" if _number(value) is not None else "unknown"


def _text(value: Any, limit: int = 200) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(value)[:limit])


def stale_policy_message(values: Mapping[str, Any]) -> str:
    """The stale-policy finding's one line: the adapter, what the server answered, the likely causes and what to do
    (values: the served-policy check's report, runtime/trainer/served_policy.py; verl's, verdict `rollout-gap`:
    the gap, its floor and the steps, runtime/verl/rollout_check.py)."""
    adapter, base = _text(values.get("adapter")), _text(values.get("base") or "the base model")
    if values.get("verdict") == "rollout-gap":  # verl's side (runtime/verl/rollout_check.py)
        return (f"stale policy: verl's rollout is not sampling the policy being trained: its probabilities of its own "
                f"answers differ from the actor's by {_g(values.get('gap_mean'))} on average (max "
                f"{_g(values.get('gap_max'))}) for {_g(values.get('steps'))} steps in a row, against "
                f"{_g(values.get('floor'))} in the attempt's first steps (threshold {_g(values.get('threshold'))}) "
                "(likely: a LoRA sync into the rollout acknowledged but not applied, or an adapter kept from an "
                "earlier step); check the rollout workers' log for the LoRA sync lines, then resume from the last "
                "checkpoint (a resume syncs the weights afresh)")
    if values.get("verdict") == "not-listed":
        answered = f"the server acknowledged loading {adapter} but does not list it in GET /v1/models"
    else:
        answered = (f"the server answers as {base} under the name {adapter} for {_g(values.get('syncs'))} checked "
                    f"syncs in a row (probe logprobs within {_g(values.get('max_abs_diff'))} of the base's, threshold "
                    f"{_g(values.get('threshold'))}, while the adapter's LoRA B norm is {_g(values.get('b_norm'))})")
    return (f"stale policy: {answered}: the rollouts come from the initial policy, not the one being trained "
            "(likely: an adapter load acknowledged but not applied, an adapter evicted from the server, or a stale "
            "prefix cache under a reused adapter name); check the server's log around the load, then restart the "
            "server and resume from the last checkpoint")


class Watcher:
    """One run's watcher: `observe()` each logged step, act on the findings; `state()` for status and summary."""

    def __init__(self, config: WatchConfig):
        self.config, self.settings, self.keys = config, config.settings, config.keys
        w = self.settings.window
        self.reward = Plateau("plateau", w, MIN_POINTS)
        self.validation = Plateau("validation_plateau", w, 4)
        self.length, self.capped = Series(w), Series(w)
        self.kl, self.ratio = Series(RECENT), Series(RECENT)
        self.dropped, self.trained = Series(w), Series(w)
        self.durations: deque[tuple[int, float]] = deque(maxlen=DURATIONS_KEPT)
        self.active: set[str] = set()
        self.cap_peak: float | None = None
        self.cap_latest: float | None = None
        self.last: tuple[int, float] | None = None
        self.objectives: list[str] = []  # the objectives of earlier attempts, from replay(), oldest first
        self.pending: list[Finding] = []
        self._stop: Finding | None = None

    @property
    def stop(self) -> Finding | None:
        """The stop finding once a plateau outlasted patience, or the served-policy check found the base model served,
        under `action: stop`; None before (and under warn)."""
        return self._stop

    # -- input ---------------------------------------------------------------------------------------------------

    def observe(self, step: int, metrics: Mapping[str, Any], time: float) -> list[Finding]:
        """Take one logged step; return what started or ended at it (nothing repeats while it lasts)."""
        if not self.settings.enabled:
            return []
        found, self.pending = self.pending, []
        return found + self._ingest(step, metrics, time)

    def replay(self, events: Iterable[dict]) -> None:
        """Warm start from the run's metrics events (steps and run_start); returns nothing. An objective that
        changed between attempts is kept and returned by the next observe()."""
        if not self.settings.enabled:
            return
        for event in events:
            kind = event.get("event")
            if kind == "run_start":
                self.pending += self._attempt(event.get("objective"), self.last[0] if self.last else 0)
            elif kind == "step" and isinstance(event.get("step"), int) and _number(event.get("time")) is not None:
                self._ingest(event["step"], event, float(event["time"]))
        self.pending += self._attempt(self.config.objective, self.last[0] if self.last else 0)
        self.pending = [f for f in self.pending if f.kind in self.active]

    def served_policy(self, step: int, report: Mapping[str, Any]) -> list[Finding]:
        """The served-policy check found the server serving the base model (trl-async's probe), or verl's rollout off
        the actor's policy (verdict `rollout-gap`, verl's rule); `clear` true: that ended. A warning under `action:
        warn`; under `action: stop` the stop itself, at once: every step after it trains on another policy's
        samples."""
        if not self.settings.enabled:
            return []
        kind = "stale_policy"
        keys = (("verdict", "gap_mean", "gap_max", "floor", "threshold", "steps")  # verl's rollout_check
                if report.get("verdict") == "rollout-gap" else
                ("adapter", "verdict", "listed", "base", "max_abs_diff", "threshold", "syncs", "b_norm"))
        values = {k: report.get(k) for k in keys}
        values = {k: (_text(v) if isinstance(v, str) else v) for k, v in values.items()
                  if v is None or isinstance(v, (str, bool)) or _number(v) is not None}
        if report.get("clear"):
            if kind not in self.active:
                return []
            self.active.discard(kind)
            again = ("verl's rollout samples the actor's policy again" if report.get("verdict") == "rollout-gap" else
                     f"the server answers {_text(report.get('adapter'))} differently from the base model again")
            return [Finding(kind, "clear", step, f"stale policy cleared at step {step}: {again}", values)]
        if kind in self.active or self._stop is not None:
            return []
        self.active.add(kind)
        message = stale_policy_message(values)
        if self.settings.action == "stop":
            self._stop = Finding("stale_policy", "stop", step, f"{message}: saving and stopping", values)
            return [self._stop]
        return [Finding(kind, "warn", step, f"{message} (watch.action: stop saves and stops the run)", values)]

    def _attempt(self, objective: Any, step: int) -> list[Finding]:
        if not isinstance(objective, str) or not objective:
            return []
        before = self.objectives[-1] if self.objectives else None
        if before != objective:
            self.objectives.append(objective)
        if before is None or before == objective:
            return []
        self.active.add("objective_change")
        return [Finding("objective_change", "warn", step,
                        f"the loss normalisation changed between attempts: {before!r} -> {objective!r} (packing or a "
                        "token budget switched on or off changes the objective, not only the speed): compare the "
                        "attempts by reward per hour and answer length, or keep the weighting constant",
                        {"before": before, "after": objective})]

    def _ingest(self, step: int, metrics: Mapping[str, Any], time: float) -> list[Finding]:
        if self.last is not None and step <= self.last[0]:
            self._rewind(step)
        elif self.last is not None and math.isfinite(time) and time > self.last[1]:
            self.durations.append((step, (time - self.last[1]) / (step - self.last[0])))
        self.last = (step, time if math.isfinite(time) else (self.last[1] if self.last else 0.0))
        value = {name: _number(metrics.get(key)) if key else None for name, key in self.keys.model_dump().items()}
        found: list[Finding] = []
        for tracker, name in ((self.reward, "reward"), (self.validation, "validation")):
            if value[name] is not None:
                tracker.series.add(step, value[name])
                found += self._plateau(tracker, step)
            elif tracker is self.reward:
                found += self._plateau_stop(tracker, step)
        found += self._cap(step, value["capped"], value["length"])
        found += self._length(step, value["length"])
        found += self._kl(step, value["kl"])
        found += self._ratio(step, value["ratio"])
        found += self._staleness(step, value["staleness"], value["samples"])
        return found

    def _rewind(self, step: int) -> None:
        """A resume from an earlier checkpoint logs its steps again: the points from `step` on are replaced."""
        for series in (self.reward.series, self.validation.series, self.length, self.capped, self.kl, self.ratio,
                       self.dropped, self.trained):
            series.rewind(step)
        while self.durations and self.durations[-1][0] >= step:
            self.durations.pop()
        self.last = None

    # -- the checks ----------------------------------------------------------------------------------------------

    def _edge(self, kind: str, on: bool, off: bool, step: int, message: str, values: dict) -> list[Finding]:
        if on and kind not in self.active:
            self.active.add(kind)
            return [Finding(kind, "warn", step, message, values)]
        if off and kind in self.active:
            self.active.discard(kind)
            return [Finding(kind, "clear", step, f"{kind.replace('_', ' ')} cleared at step {step}", values)]
        return []

    def _plateau(self, tracker: Plateau, step: int) -> list[Finding]:
        change = tracker.judge(step, self.settings)
        fitted, s = tracker.fit, self.settings
        what = "validation score" if tracker is self.validation else "reward"
        if change is True:
            self.active.add(tracker.kind)
            gain, upper = fitted.slope * s.window, (fitted.slope + t_upper(fitted.n - 2) * fitted.se) * s.window
            left = self._gpu_hours(self.config.total_steps - step) if self.config.total_steps else None
            then = (f"stopping after {s.patience} more flat steps" if s.action == "stop" and tracker is self.reward
                    else "stop the run if the score is good enough (watch.action: stop saves and stops)")
            tail = f"; {left:.1f} GPU-hours left to the planned end" if left is not None else ""
            noise = f" at noise {tracker.noise:.3f} a step" if tracker.noise is not None else ""
            return [Finding(tracker.kind, "warn", step,
                            f"{what} flat since step {tracker.since}: {fitted.mean:.4f} mean, {gain:+.4f} per "
                            f"{s.window} steps over the last {tracker.steps} steps{noise} (at most {upper:+.4f}, "
                            f"under min_gain {s.min_gain:g}){tail}: {then}",
                            {"since": tracker.since, "mean": _r(fitted.mean), "gain_per_window": _r(gain),
                             "upper_gain_per_window": _r(upper), "steps_fitted": tracker.steps,
                             "noise_per_step": _r(tracker.noise), "gpu_hours_left": _r(left, 2)})]
        if change is False:
            self.active.discard(tracker.kind)
            return [Finding(tracker.kind, "clear", step,
                            f"{what} rising again at step {step}: {fitted.slope * s.window:+.4f} per {s.window} steps",
                            {"gain_per_window": _r(fitted.slope * s.window)})]
        return self._plateau_stop(tracker, step) if tracker is self.reward else []

    def _plateau_stop(self, tracker: Plateau, step: int) -> list[Finding]:
        s = self.settings
        if s.action != "stop" or self._stop is not None or tracker.warned_at is None:
            return []
        if step - tracker.warned_at < s.patience:
            return []
        saved = self._gpu_hours(self.config.total_steps - step) if self.config.total_steps else None
        after = self._gpu_hours(step - tracker.since)
        text = f"; stopping saves {saved:.1f} GPU-hours against step {self.config.total_steps}" if saved else ""
        self._stop = Finding("plateau_stop", "stop", step,
                             f"reward flat since step {tracker.since} and {step - tracker.warned_at} steps past the "
                             f"warning (patience {s.patience}): saving and stopping{text}",
                             {"since": tracker.since, "gpu_hours_after_plateau": _r(after, 2),
                              "gpu_hours_saved": _r(saved, 2)})
        return [self._stop]

    def _cap(self, step: int, capped: float | None, length: float | None) -> list[Finding]:
        if capped is None:
            return []
        self.capped.add(step, capped)
        self.cap_latest = capped
        self.cap_peak = capped if self.cap_peak is None else max(self.cap_peak, capped)
        share, bound = self.capped.recent(), self.settings.cap_share
        if bound is None:  # off (a run of length rewards alone: the engine resolved `auto` so)
            return []
        bound = CAP_SHARE_AUTO if bound == "auto" else bound  # the engine resolves auto; a bare config means 0.2
        cap = self.config.max_completion_length
        at = f" {cap}-token" if cap else ""
        return self._edge("cap_share", self.capped.holds(RECENT) and share > bound, share <= bound * CLEAR_MARGIN, step,
                          f"{share:.1%} of answers hit the{at} length cap over the last "
                          f"{min(RECENT, len(self.capped.points))} "
                          f"logged steps (bound {bound:.0%}; mean length "
                          f"{f'{length:.1f}' if length is not None else 'unknown'}): raise max_completion_length, "
                          "or use a per-token loss (packing) so long answers stop growing",
                          {"share": _r(share), "bound": bound, "mean_length": _r(length, 1), "cap": cap})

    def _length(self, step: int, length: float | None) -> list[Finding]:
        if length is None:
            return []
        self.length.add(step, length)
        bound = self.settings.length_drift
        fitted = self.length.line() if self.length.covers(step) else None
        if bound is None or fitted is None or fitted.n < MIN_POINTS or fitted.mean <= 0:
            return []
        w = self.settings.window
        change = fitted.slope * w / fitted.mean
        sure = (abs(fitted.slope) - t_upper(fitted.n - 2) * fitted.se) * w / fitted.mean
        way = "grew" if change > 0 else "shrank"
        objective = self._objective()
        hint = f" under the objective {objective!r}" if objective else ""
        return self._edge("length_drift", sure > bound, abs(change) <= bound * CLEAR_MARGIN, step,
                          f"mean completion length {way} {abs(change):.0%} over the last {w} steps (to "
                          f"{fitted.end:.0f} tokens{hint}; bound {bound:.0%}): check the loss normalisation "
                          "(per-answer weighting lets long wrong answers grow) and the cap share",
                          {"change_per_window": _r(change), "length": _r(fitted.end, 1), "bound": bound})

    def _kl(self, step: int, kl: float | None) -> list[Finding]:
        bound = self.settings.kl_max
        if kl is None or bound is None:
            return []
        self.kl.add(step, kl)
        mean = self.kl.recent()
        return self._edge("kl", self.kl.holds(RECENT) and mean > bound, mean <= bound * CLEAR_MARGIN, step,
                          f"KL to the reference {mean:.3g} over the last {min(RECENT, len(self.kl.points))} logged "
                          f"steps (bound {bound:g}): lower the learning rate or raise beta",
                          {"kl": _r(mean, 6), "bound": bound})

    def _ratio(self, step: int, ratio: float | None) -> list[Finding]:
        band = self.settings.ratio_band
        if ratio is None or band is None:
            return []
        self.ratio.add(step, ratio)
        mean = self.ratio.recent()
        low, high = band
        inside = 1 - (1 - low) * CLEAR_MARGIN <= mean <= 1 + (high - 1) * CLEAR_MARGIN
        return self._edge("ratio", self.ratio.holds(RECENT) and not low <= mean <= high, inside, step,
                          f"mean importance ratio {mean:.3f} outside [{low:g}, {high:g}]: the rollouts lag the policy "
                          "(lower max_staleness or the learning rate)",
                          {"ratio": _r(mean, 4), "low": low, "high": high})

    def _staleness(self, step: int, dropped: float | None, trained: float | None) -> list[Finding]:
        bound = self.settings.staleness_drop_share
        if trained is None or bound is None:
            return []
        self.dropped.add(step, dropped or 0.0)
        self.trained.add(step, trained)
        lost = sum(v for _, v in self.dropped.points)
        total = lost + sum(v for _, v in self.trained.points)
        if total <= 0 or len(self.trained.points) < RECENT:
            return []
        share = lost / total
        return self._edge("staleness", share > bound, share <= bound * CLEAR_MARGIN, step,
                          f"{share:.0%} of generated samples dropped as stale over the last "
                          f"{len(self.trained.points)} logged steps (bound {bound:.0%}): generation runs ahead; lower "
                          "max_inflight_tasks or queue_maxsize, or raise max_staleness",
                          {"share": _r(share), "dropped": lost, "bound": bound})

    # -- figures -------------------------------------------------------------------------------------------------

    def _objective(self) -> str | None:
        return self.config.objective or (self.objectives[-1] if self.objectives else None)

    def seconds_per_step(self) -> float | None:
        return statistics.median(d for _, d in self.durations) if self.durations else None

    def _gpu_hours(self, steps: int) -> float | None:
        """GPU-hours of *steps* steps at the median step time; None when unknown or the run holds no GPU (a CPU run:
        its messages then leave GPU-hours out)."""
        rate = self.seconds_per_step()
        return None if rate is None or not self.config.gpus else max(steps, 0) * rate * self.config.gpus / 3600

    def _time_to_target(self, fitted: Fit | None) -> tuple[float | None, float | None]:
        target = self.settings.target_reward
        if target is None or fitted is None:
            return None, None
        if fitted.end >= target:
            return 0.0, 0.0
        if fitted.slope - t_upper(fitted.n - 2) * fitted.se <= 0:
            return None, None  # not surely rising: no honest estimate
        steps = (target - fitted.end) / fitted.slope
        rate = self.seconds_per_step()
        return steps, (None if rate is None else steps * rate)

    def state(self) -> dict[str, Any]:
        """The watcher's figures as JSON-able values (None where unknown)."""
        s, fitted, last = self.settings, self.reward.fit, self.last[0] if self.last else None
        if fitted is None and len(self.reward.series.points) >= 3:
            fitted = self.reward.series.line(self.reward.steps)
        steps, seconds = self._time_to_target(fitted)
        since = self.reward.since
        after = last - since if since is not None and last is not None else None
        length = self.length.line()
        total = self.config.total_steps
        return {
            "enabled": s.enabled,
            "step": last,
            "reward_mean": _r(fitted.mean if fitted else None),
            "reward_trend": _r(fitted.end if fitted else None),
            "slope_per_step": _r(fitted.slope if fitted else None, 8),
            "slope_se": _r(fitted.se if fitted else None, 8),
            "gain_per_window": _r(fitted.slope * s.window if fitted else None),
            "window": s.window,
            "trend_steps": self.reward.steps,
            "reward_noise": _r(self.reward.noise, 5),
            "plateau_since": since,
            "steps_after_plateau": after,
            "gpu_hours_after_plateau": _r(self._gpu_hours(after) if after is not None else None, 3),
            "validation_plateau_since": self.validation.since,
            "cap_share_latest": _r(self.cap_latest),
            "cap_share_peak": _r(self.cap_peak),
            "length_latest": _r(self.length.points[-1][1] if self.length.points else None, 1),
            "length_change_per_window": _r(length.slope * s.window / length.mean if length and length.mean else None),
            "target_reward": s.target_reward,
            "time_to_target_steps": _r(steps, 1),
            "time_to_target_s": _r(seconds, 1),
            "seconds_per_step": _r(self.seconds_per_step(), 3),
            "gpus": self.config.gpus,
            "total_steps": total,
            "gpu_hours_left": _r(self._gpu_hours(total - last) if total and last is not None else None, 3),
            "stop_step": self._stop.step if self._stop else None,
            "gpu_hours_saved": _r(self._gpu_hours(total - self._stop.step) if self._stop and total else None, 3),
            "objective": self._objective(),
            "objectives": list(self.objectives) or ([self.config.objective] if self.config.objective else []),
            "active": sorted(self.active),
        }
