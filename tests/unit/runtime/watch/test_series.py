"""The watcher's series and plateau rule (runtime/watch/series.py): the least-squares fit recovers a known line and its
noise, the prefix sums of a series match the direct fit over any recent stretch at large step numbers, the noise
estimate ignores a trend, the stretch holds the slope's error to min_gain / MARGINS and no further, and the rule's
error rates hold across noise (issue 43): slow risers at noise 0.1 are not called flat, a plateau at noise 0.05 is
caught within 2.5 windows, and the same with steps that are means of binary answers."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from grpo_deploy.runtime.watch.config import WatchConfig, WatchSettings
from grpo_deploy.runtime.watch.series import MARGINS, MAX_STRETCH, Series, fit, stretch
from tests.unit.runtime.watch import noisy_streams
from tests.unit.runtime.watch.test_watcher import run

DEFAULTS = WatchSettings()


def first_plateau_warning(events, settings: WatchSettings = DEFAULTS):
    warns = [f for f in run(events, WatchConfig(settings=settings))[1] if f.kind == "plateau" and f.level == "warn"]
    return warns[0] if warns else None


def slope_error_per_window(noise: float, density: float, steps: int, window: int) -> float:
    """The standard error of a line's slope over *steps* steps of *density* evenly spread points, times the window."""
    points = max(3, round(steps * density))
    spacing = steps / points
    xs = [i * spacing for i in range(points)]
    mean = sum(xs) / points
    return window * noise / math.sqrt(sum((x - mean) ** 2 for x in xs))


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


def test_a_recent_stretch_matches_the_direct_fit_of_its_points_across_gaps_restarts_and_a_rewind():
    rng = random.Random(4)
    series, step = Series(300), 5_000_000
    for _ in range(1_000):  # more than three restarts of the sums
        step += rng.choice((1, 1, 2, 7))
        series.add(step, 0.3 + 2e-4 * (step - 5_000_000) + rng.gauss(0, 0.05))
    series.rewind(step - 20)
    last = series.points[-1][0]
    for steps in (40, 120, 300):
        inside = [(x, y) for x, y in series.points if x > last - steps]
        direct, line = fit(inside), series.line(steps)
        assert line.n == len(inside)
        assert line.slope == pytest.approx(direct.slope, rel=1e-6, abs=1e-12)
        assert line.se == pytest.approx(direct.se, rel=1e-5)
        assert line.end == pytest.approx(direct.end, rel=1e-9)


def test_the_noise_estimate_ignores_a_trend_and_a_bend_and_counts_sparse_points():
    """A steep rise that turns flat mid-window: the successive differences still give the noise, where the residuals
    of a line through the bend would more than double it."""
    rng = random.Random(2)
    dense, sparse = Series(500), Series(500)
    for s in range(1, 201):
        value = 0.1 + 0.01 * min(s, 150) + rng.gauss(0, 0.02)  # 1.0 a window (50 x min_gain), then flat
        dense.add(s, value)
        if s % 10 == 0:
            sparse.add(s, value)
    noise, density = dense.noise(100)
    assert noise == pytest.approx(0.02, rel=0.15) and density == pytest.approx(1.0)
    line = dense.line(100)
    residual = line.se * math.sqrt(sum((x - 150.5) ** 2 for x in range(101, 201)))
    assert residual > 2 * 0.02
    assert sparse.noise(100)[1] == pytest.approx(0.1)


@pytest.mark.parametrize("noise,density", [(0.005, 1.0), (0.02, 1.0), (0.05, 1.0), (0.12, 1.0), (0.02, 0.1),
                                           (0.5, 1.0)])
def test_the_stretch_is_the_shortest_that_holds_the_slope_error(noise, density):
    steps = stretch(noise, density, DEFAULTS)
    bar = DEFAULTS.min_gain / MARGINS
    assert DEFAULTS.window <= steps <= MAX_STRETCH * DEFAULTS.window
    if DEFAULTS.window < steps < MAX_STRETCH * DEFAULTS.window:
        assert slope_error_per_window(noise, density, steps, DEFAULTS.window) <= bar * 1.02
        assert slope_error_per_window(noise, density, round(steps * 0.95), DEFAULTS.window) > bar
    elif steps == DEFAULTS.window:
        assert slope_error_per_window(noise, density, steps, DEFAULTS.window) <= bar * 1.02
    else:
        assert slope_error_per_window(noise, density, steps, DEFAULTS.window) > bar


def test_the_watcher_fits_longer_at_higher_noise_and_says_so():
    quiet, _ = run(noisy_streams.slow_riser(1, 0.01))
    loud, _ = run(noisy_streams.slow_riser(1, 0.1))
    assert quiet.state()["trend_steps"] == DEFAULTS.window
    assert loud.state()["reward_noise"] == pytest.approx(0.1, rel=0.15)
    assert loud.state()["trend_steps"] == stretch(loud.reward.noise, 1.0, DEFAULTS) > 2 * DEFAULTS.window
    warned = first_plateau_warning(noisy_streams.plateau_after_rise(1, 0.08)[0])
    assert warned.values["steps_fitted"] > DEFAULTS.window
    assert f"over the last {warned.values['steps_fitted']} steps at noise" in warned.message


@pytest.mark.parametrize("noise", [0.1, 0.12])
def test_slow_risers_at_high_noise_are_not_called_flat(noise):
    """A run still gaining 2.5 x min_gain a window at the noise of a 16-answer step (issue 43: the window-only rule
    called 3 of 30 such runs flat at 0.1)."""
    flagged = [seed for seed in range(30) if first_plateau_warning(noisy_streams.slow_riser(seed, noise)) is not None]
    assert flagged == []


def test_a_plateau_at_noise_005_is_caught_within_two_and_a_half_windows():
    """Noise 0.05 is a step of 128 binary answers near 0.5 (issue 43: the window-only rule took up to 324 steps)."""
    delays = []
    for seed in range(60):
        events, onset = noisy_streams.plateau_after_rise(seed, 0.05)
        warned = first_plateau_warning(events)
        assert warned is not None, f"seed {seed}: a plateau of 600 steps never flagged"
        delays.append(warned.step - onset)
        assert warned.values["since"] <= warned.step
    assert min(delays) > 0  # flagged after the onset, not on the rise
    assert statistics.quantiles(delays, n=20)[-1] <= 2.5 * DEFAULTS.window


def test_binary_answers_16_a_step_rising_is_not_flat_and_a_plateau_is_caught():
    for seed in range(10):
        assert first_plateau_warning(noisy_streams.slow_riser(seed, 0.0, answers=16)) is None, seed
        events, onset = noisy_streams.plateau_after_rise(seed, 0.0, answers=16)
        warned = first_plateau_warning(events)
        assert warned is not None and warned.step > onset, seed  # caught within its 600 flat steps
