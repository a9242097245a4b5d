"""The watcher's series (runtime/watch/series.py): the least-squares fit recovers a known line and its noise, and the
running sums of a series match the direct fit at large step numbers."""

from __future__ import annotations

import math
import random

import pytest

from grpo_deploy.runtime.watch.series import fit
from tests.unit.runtime.watch.test_watcher import run


def test_fit_recovers_a_known_line_and_its_noise():
    rng = random.Random(1)
    pts = [(x, 0.5 + 0.003 * x + rng.gauss(0, 0.02)) for x in range(200)]
    line = fit(pts)
    assert abs(line.slope - 0.003) < 3 * line.se
    expected_se = 0.02 / math.sqrt(sum((x - 99.5) ** 2 for x in range(200)))
    assert 0.8 < line.se / expected_se < 1.2


def test_running_sums_match_the_direct_fit_at_large_step_numbers():
    watcher, _ = run([{"event": "step", "step": 900_000 + s, "time": float(s), "reward": 0.4 + 0.0001 * s
                       + 0.01 * math.sin(s)} for s in range(1, 400)])
    direct = fit(list(watcher.reward.series.points))
    line = watcher.reward.series.line()
    assert line.slope == pytest.approx(direct.slope, rel=1e-6)
    assert line.se == pytest.approx(direct.se, rel=1e-4)
    assert line.end == pytest.approx(direct.end, rel=1e-9)
