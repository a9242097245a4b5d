"""The run watcher's statistics: a least-squares line over a window (`fit`, and `_Series`'s running sums for one
metric), the t quantile of its slope, and the plateau test on one series (`_Plateau`).

The plateau statistic: a least-squares line over the last `window` steps of reward, with the window's own noise (the
residual standard error) giving the slope's standard error; the reward is flat when even the optimistic slope (the
one-sided 99% upper bound) projects less than `min_gain` over a window. It clears only when even the pessimistic slope
(the lower bound) projects `min_gain` or more again: the same evidence both ways, so noise does not flap it.
docs/MEASUREMENTS.md ("The run watcher's alarms") has the false-alarm rate and the detection delay at the defaults.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from grpo_deploy.runtime.watch.config import WatchSettings

# One-sided 99% normal quantile: the optimistic slope is the fitted one plus this many standard errors.
Z_UPPER = 2.326
# Points a window's line needs before it is judged (fewer: the noise estimate means little).
MIN_POINTS = 5
# Logged values averaged for the level checks (cap share, KL, ratio): one noisy step does not raise a warning.
RECENT = 5


@dataclass(frozen=True)
class Fit:
    """A least-squares line over a window: slope per step, its standard error, the mean and the line's value at the
    window's last step."""

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


class _Series:
    """The (step, value) points of one metric within the last `span` steps, with running sums for an O(1) line fit
    (re-summed around the first point every `span` additions, so large step numbers lose no precision)."""

    def __init__(self, span: int):
        self.span, self.points = span, deque()
        self._resum()

    def _resum(self) -> None:
        self.base = self.points[0][0] if self.points else 0
        self.adds = 0
        xs = [(x - self.base, y) for x, y in self.points]
        self.sx, self.sy = sum(x for x, _ in xs), sum(y for _, y in xs)
        self.sxx, self.sxy, self.syy = (sum(x * x for x, _ in xs), sum(x * y for x, y in xs),
                                        sum(y * y for _, y in xs))

    def _sums(self, point: tuple[int, float], sign: int) -> None:
        x, y = point[0] - self.base, point[1]
        self.sx += sign * x
        self.sy += sign * y
        self.sxx += sign * x * x
        self.sxy += sign * x * y
        self.syy += sign * y * y

    def add(self, step: int, value: float) -> None:
        self.points.append((step, value))
        self._sums(self.points[-1], 1)
        while self.points and self.points[0][0] <= step - self.span:
            self._sums(self.points.popleft(), -1)
        self.adds += 1
        if self.adds > self.span:
            self._resum()

    def rewind(self, step: int) -> None:
        while self.points and self.points[-1][0] >= step:
            self._sums(self.points.pop(), -1)
        self._resum()

    def covers(self, step: int) -> bool:
        """Whether the points reach back a whole window (the first logged step may come later than step 1)."""
        return bool(self.points) and self.points[0][0] <= step - self.span + max(1, self.span // 10)

    def recent(self, count: int = RECENT) -> float | None:
        values = [self.points[-i][1] for i in range(1, min(count, len(self.points)) + 1)]
        return sum(values) / len(values) if values else None

    def line(self) -> Fit | None:
        """fit() of the points, from the running sums."""
        n = len(self.points)
        if n < 3:
            return None
        sxx = self.sxx - self.sx * self.sx / n
        if sxx <= 1e-9:
            return None
        sxy = self.sxy - self.sx * self.sy / n
        syy = self.syy - self.sy * self.sy / n
        slope = sxy / sxx
        se = math.sqrt(max(syy - slope * sxy, 0.0) / (n - 2) / sxx)
        ybar, xbar = self.sy / n, self.sx / n
        return Fit(slope, se, ybar, ybar + slope * (self.points[-1][0] - self.base - xbar), n)


class _Plateau:
    """The flat test for one series, with its warning step and the step the flat window began."""

    def __init__(self, kind: str, window: int, min_points: int):
        self.kind, self.series, self.min_points = kind, _Series(window), min_points
        self.fit: Fit | None = None
        self.since: int | None = None
        self.warned_at: int | None = None

    def judge(self, step: int, settings: WatchSettings) -> bool | None:
        """True: entered flat now; False: left flat now; None: no change."""
        pts = self.series.points
        self.fit = self.series.line() if len(pts) >= self.min_points and self.series.covers(step) else None
        if self.fit is None:
            return None
        margin = t_upper(self.fit.n - 2) * self.fit.se
        upper, lower = (self.fit.slope + margin) * settings.window, (self.fit.slope - margin) * settings.window
        if self.since is None and upper < settings.min_gain:
            self.since, self.warned_at = max(pts[0][0], step - settings.window + 1), step
            return True
        if self.since is not None and lower >= settings.min_gain:
            self.since = self.warned_at = None
            return False
        return None
