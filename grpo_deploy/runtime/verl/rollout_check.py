"""verl's side of the served-policy check (pure): is verl's rollout sampling the policy being trained? verl syncs the
actor's LoRA into its colocated vLLM before each step's generation, over no HTTP, so the trl-async probe
(runtime/trainer/served_policy.py) has nothing to ask. verl itself scores the rollout's own answers twice: vLLM's
log-probs as it sampled them (`rollout.calculate_log_probs`, which the kit turns on) and the actor's recomputed
ones (`old_log_prob`), and logs the mean and max |p_rollout - p_actor| per step (`training/rollout_probs_diff_*`).

With the sync applied the two differ by the numerics alone (the CPU rehearsal: 9.2e-5 to 9.7e-5 measured; a bf16
GPU: ~1e-3, not measured here). A sync acknowledged but not applied (verl #7495: the rollout samples the initial
policy for a whole run), an adapter dropped or an old one kept, leave the rollout on a policy the actor has left, and
the gap grows with every update.

The rule: the gap's floor is the median of the first FLOOR_STEPS steps this process saw (a resume learns it again:
each attempt starts with a full sync); AFTER judged steps in a row whose mean gap is above both FACTOR x the floor
and TOLERANCE make a finding; a step under CLEAR_SHARE of the threshold clears it. A step with no gap logged (NaN,
verl's own "invalid") is not judged and keeps the count.

Limits: a rollout that never synced from the run's first step is caught once the actor has moved FACTOR times as far
as it did in its first steps, not at once (the floor then holds the early moves as well as the numerics). And a fault
that outlives a resume is not caught after it: the resumed actor holds a trained adapter while the rollout samples
the base, and the new attempt's floor takes that gap for the numerics.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MEAN_KEY = "training/rollout_probs_diff_mean"
MAX_KEY = "training/rollout_probs_diff_max"
VALID_KEY = "training/rollout_probs_diff_valid"
KEYS = (MEAN_KEY, MAX_KEY, VALID_KEY)
"""verl 0.9.1's per-step metrics the rule reads (verl/utils/debug/metrics.py: probabilities, not log-probabilities,
over the answers' tokens)."""
FLOOR_STEPS = 3
"""Steps whose median mean gap is the floor (the numerics of a rollout in step with its actor; the median, so one
step unusually low does not lower the threshold)."""
FACTOR = 10.0
"""A mean gap this many floors above counts as a rollout off the actor's policy."""
TOLERANCE = 1e-3
"""...and above this absolute mean |p_rollout - p_actor|, whatever the floor: the numerics of a healthy bf16 GPU
rollout are about 1e-3 (not measured here); the CPU rehearsal's vLLM against its FSDP actor measured 9.2e-5 to
9.7e-5 (mean), 4e-4 to 5.3e-4 (max)."""
AFTER = 3
"""Steps in a row over the threshold before a finding."""
CLEAR_SHARE = 0.8
"""A finding clears at a step whose mean gap is under this share of the threshold (no warn/clear lines from a gap
that hovers at the line), as the watcher's level warnings do."""


@dataclass(frozen=True)
class GapVerdict:
    """`verdict`: floor (the step sets the floor), in-step (the gap within the threshold), off-policy (over it),
    unknown (no gap logged: the step is not judged); `finding`: the values to hand to the run watcher when this step
    calls for one; `clear`: a finding ended."""

    verdict: str
    threshold: float | None
    streak: int
    finding: dict[str, Any] | None = None
    clear: bool = False
    mean: float | None = None
    peak: float | None = None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


class RolloutGapRule:
    """The rule over one attempt's steps (see the module's docstring)."""

    def __init__(self, floor_steps: int = FLOOR_STEPS, factor: float = FACTOR, tolerance: float = TOLERANCE,
                 after: int = AFTER):
        self.floor_steps, self.factor, self.tolerance, self.after = floor_steps, factor, tolerance, after
        self.early: list[float] = []
        self.streak = 0
        self.active = False

    @property
    def floor(self) -> float | None:
        return statistics.median(self.early) if len(self.early) >= self.floor_steps else None

    def threshold(self) -> float | None:
        floor = self.floor
        return None if floor is None else max(self.tolerance, self.factor * floor)

    def judge(self, step: int, metrics: Mapping[str, Any]) -> GapVerdict:
        mean, peak = _finite(metrics.get(MEAN_KEY)), _finite(metrics.get(MAX_KEY))
        if mean is None or metrics.get(VALID_KEY, 1) in (0, False):
            return GapVerdict("unknown", self.threshold(), self.streak)
        if self.floor is None:
            self.early.append(mean)
            return GapVerdict("floor", self.threshold(), 0, mean=mean, peak=peak)
        threshold = self.threshold()
        if mean <= threshold:
            self.streak = 0
            if self.active and mean > CLEAR_SHARE * threshold:  # hovering at the line: the finding lasts
                return GapVerdict("in-step", threshold, 0, mean=mean, peak=peak)
            clear, self.active = self.active, False
            return GapVerdict("in-step", threshold, 0, clear=clear, mean=mean, peak=peak)
        self.streak += 1
        if self.streak < self.after or self.active:
            return GapVerdict("off-policy", threshold, self.streak, mean=mean, peak=peak)
        self.active = True
        values = {"verdict": "rollout-gap", "step": step, "gap_mean": mean, "gap_max": peak, "floor": self.floor,
                  "threshold": threshold, "steps": self.streak}
        return GapVerdict("off-policy", threshold, self.streak, finding=values, mean=mean, peak=peak)
