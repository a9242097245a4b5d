"""The run watcher's statistics: a least-squares line over a stretch of steps (`fit`, and `Series`'s prefix sums for
one metric), the per-step noise around it, the t quantile of its slope, and the plateau test on one series
(`Plateau`).

The plateau rule. The reward is flat when even the optimistic slope of a least-squares line (the fitted one plus the
one-sided 99% t bound, from the line's residual standard error) projects less than `min_gain` over `window` steps; it
clears only when even the pessimistic slope (the lower bound) projects `min_gain` or more again, so noise does not flap
it. The line spans the last `window` steps, or more when the reward is noisier: the shortest stretch whose slope's
standard error, projected over `window` steps, is at most `min_gain / MARGINS` (at most `MAX_STRETCH` windows). A line
over n steps at per-point noise sigma, `density` points a step, has a slope error of sigma * sqrt(12 / (density * n^3)),
so the stretch is n = (12 * (MARGINS * window * sigma / min_gain)^2 / density)^(1/3), never under `window`.

The error rates then hold at any noise up to the cap's (~0.26 a step at the defaults): a run gaining 2 x `min_gain` a
window is called flat only when its fitted slope falls MARGINS + 2.33 = 4.8 standard errors short of its true one (under
1 in 10^6 a step), and a stretch that is wholly flat warns with ~57% a step (its slope sits MARGINS - 2.33 = 0.17
standard errors under the bar, or more when the stretch is a plain window). The noise costs time instead: the delay
grows with the stretch, as sigma^(2/3) (at the defaults one window up to noise 0.023 a step, 1.7 windows at 0.05, 3 at
0.12). `window` is the shortest stretch and the unit of `min_gain`; the bar is the slope min_gain / window, so at a
given noise a shorter window stretches to the same n.

sigma comes from the successive differences of the last `window` steps (sum (y[i] - y[i-1])^2 / (2 * pairs)): a trend
and the bend at a plateau's onset barely touch it, where they would inflate a line's residuals. It is measured rather
than derived: for rewards that are means of binary answers the variance would follow from the mean and the answers a
step (p(1-p)/answers), but the watcher does not know that a reward is binary, and GRPO's answers come in groups per
prompt of unlike difficulty, which adds variance that p(1-p)/answers misses. The test's standard error stays the
residual one of the fitted stretch, which also sees slow wander between steps.
docs/MEASUREMENTS.md ("The run watcher's alarms") has the false-alarm rate and the detection delay across noise levels.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from grpo_deploy.runtime.watch.config import WatchSettings

# One-sided 99% normal quantile: the optimistic slope is the fitted one plus this many standard errors.
Z_UPPER = 2.326
# Points a window's line needs before it is judged (fewer: the noise estimate means little).
MIN_POINTS = 5
# Logged values averaged for the level checks (cap share, KL, ratio), and the points they hold before a warning: one
# noisy step, the first one included (a base model's first answers run long), does not raise a warning.
RECENT = 5
# The plateau's stretch holds the slope's standard error (per window) to min_gain / MARGINS.
MARGINS = 2.5
# The longest stretch, in windows (beyond it the noise wins: the error rates then loosen to the 99% bound's).
MAX_STRETCH = 5


@dataclass(frozen=True)
class Fit:
    """A least-squares line over a stretch: slope per step, its standard error, the mean, the line's value at the
    stretch's last step and the points it holds."""

    slope: float
    se: float
    mean: float
    end: float
    n: int


def fit(points: Iterable[tuple[int, float]]) -> Fit | None:
    """The least-squares line through (step, value) points; None under 3 points or a single step."""
    pts = list(points)
    n = len(pts)
    if n < 3:
        return None
    xbar = sum(x for x, _ in pts) / n
    ybar = sum(y for _, y in pts) / n
    sxx = sum((x - xbar) ** 2 for x, _ in pts)
    if sxx <= 0:
        return None
    slope = sum((x - xbar) * (y - ybar) for x, y in pts) / sxx
    ssr = sum((y - ybar - slope * (x - xbar)) ** 2 for x, y in pts)
    se = math.sqrt(ssr / (n - 2) / sxx)
    return Fit(slope, se, ybar, ybar + slope * (pts[-1][0] - xbar), n)


def t_upper(df: int) -> float:
    """The one-sided 99% quantile of Student's t with df degrees of freedom (Cornish-Fisher from the normal; within
    8% of the table from df 3, exact in the limit)."""
    z = Z_UPPER
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def stretch(noise: float, density: float, settings: WatchSettings) -> int:
    """Steps a line must span for its slope's standard error, projected over a window, to be at most min_gain /
    MARGINS at per-point noise *noise* and *density* points per step: at least a window, at most MAX_STRETCH."""
    window = settings.window
    if noise <= 0 or density <= 0:
        return window
    steps = (12 * (MARGINS * window * noise / settings.min_gain) ** 2 / density) ** (1 / 3)
    return min(max(window, math.ceil(steps)), MAX_STRETCH * window)


class Series:
    """The (step, value) points of one metric within the last `span` steps, with prefix sums (of 1, x, y, x², xy, y²
    and the squared step-to-step change) for an O(log n) line fit and noise figure over any recent stretch. The sums
    restart around the first point every `span` additions, so large step numbers lose no precision."""

    def __init__(self, span: int):
        self.span = span
        self.points: deque[tuple[int, float]] = deque()
        self._resum()

    def _resum(self) -> None:
        self.base = self.points[0][0] if self.points else 0
        self.adds = 0
        self.sums: deque[tuple[float, ...]] = deque([(0.0,) * 7])  # sums[i]: over the points before points[i]
        before = None
        for step, value in self.points:
            self._extend(step, value, before)
            before = value

    def _extend(self, step: int, value: float, before: float | None) -> None:
        x, y, last = step - self.base, value, self.sums[-1]
        change = 0.0 if before is None else (value - before) ** 2
        self.sums.append((last[0] + 1, last[1] + x, last[2] + y, last[3] + x * x, last[4] + x * y, last[5] + y * y,
                          last[6] + change))

    def add(self, step: int, value: float) -> None:
        before = self.points[-1][1] if self.points else None
        self.points.append((step, value))
        self._extend(step, value, before)
        while self.points and self.points[0][0] <= step - self.span:
            self.points.popleft()
            self.sums.popleft()
        self.adds += 1
        if self.adds > self.span:
            self._resum()

    def rewind(self, step: int) -> None:
        while self.points and self.points[-1][0] >= step:
            self.points.pop()
        self._resum()

    def first_index(self, steps: int | None) -> int:
        """The index of the first point within the last *steps* steps (0: all the points)."""
        if steps is None or not self.points:
            return 0
        return bisect_right(self.points, (self.points[-1][0] - steps, math.inf))

    def covers(self, step: int, steps: int | None = None) -> bool:
        """Whether the points reach back *steps* steps (default: the span) from *step* (the first logged step may come
        later than step 1)."""
        steps = self.span if steps is None else steps
        return bool(self.points) and self.points[0][0] <= step - steps + max(1, steps // 10)

    def holds(self, count: int) -> bool:
        """Whether the series holds at least *count* points."""
        return len(self.points) >= count

    def recent(self, count: int = RECENT) -> float | None:
        values = [self.points[-i][1] for i in range(1, min(count, len(self.points)) + 1)]
        return sum(values) / len(values) if values else None

    def noise(self, steps: int | None = None) -> tuple[float, float] | None:
        """The per-point noise over the last *steps* steps (default: all), from successive differences
        (sqrt(sum of squared changes / (2 * pairs))), and the points per step there; None under 3 pairs."""
        first, last = self.first_index(steps), len(self.points) - 1
        pairs = last - first
        if pairs < 3:
            return None
        changes = self.sums[last + 1][6] - self.sums[first + 1][6]
        covered = self.points[last][0] - self.points[first][0]
        return math.sqrt(changes / (2 * pairs)), pairs / covered

    def line(self, steps: int | None = None) -> Fit | None:
        """fit() of the points within the last *steps* steps (default: all), from the prefix sums."""
        first = self.first_index(steps)
        total = [a - b for a, b in zip(self.sums[-1], self.sums[first], strict=True)]
        n = int(total[0])
        if n < 3:
            return None
        sx, sy = total[1], total[2]
        sxx = total[3] - sx * sx / n
        if sxx <= 1e-9:
            return None
        sxy = total[4] - sx * sy / n
        syy = total[5] - sy * sy / n
        slope = sxy / sxx
        se = math.sqrt(max(syy - slope * sxy, 0.0) / (n - 2) / sxx)
        ybar, xbar = sy / n, sx / n
        return Fit(slope, se, ybar, ybar + slope * (self.points[-1][0] - self.base - xbar), n)


class Plateau:
    """The flat test for one series: its stretch (steps fitted), noise, warning step and the step the flat stretch
    began."""

    def __init__(self, kind: str, window: int, min_points: int):
        self.kind, self.series, self.min_points = kind, Series(MAX_STRETCH * window), min_points
        self.fit: Fit | None = None
        self.noise: float | None = None
        self.steps: int = window
        self.since: int | None = None
        self.warned_at: int | None = None

    def judge(self, step: int, settings: WatchSettings) -> bool | None:
        """True: entered flat now; False: left flat now; None: no change."""
        measured = self.series.noise(settings.window)
        self.noise = measured[0] if measured else None
        self.steps = stretch(*measured, settings) if measured else settings.window
        fitted = self.series.line(self.steps) if self.series.covers(step, self.steps) else None
        self.fit = fitted if fitted is not None and fitted.n >= self.min_points else None
        if self.fit is None:
            return None
        margin = t_upper(self.fit.n - 2) * self.fit.se
        upper, lower = (self.fit.slope + margin) * settings.window, (self.fit.slope - margin) * settings.window
        if self.since is None and upper < settings.min_gain:
            first = self.series.points[self.series.first_index(self.steps)][0]
            self.since, self.warned_at = max(first, step - self.steps + 1), step
            return True
        if self.since is not None and lower >= settings.min_gain:
            self.since = self.warned_at = None
            return False
        return None
