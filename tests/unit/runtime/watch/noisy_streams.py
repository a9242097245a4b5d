"""Seeded reward streams at a chosen per-step noise, for the plateau rule's tests and benchmarks/watcher_alarms.py's
noise sweep: a run still rising slowly and a plateau after a rise, each as metrics events ({"event": "step", "step",
"time", "reward"}). The noise is Gaussian with a given standard deviation, or, with `answers`, that of a step's mean
over that many binary answers (sqrt(p(1-p)/answers): ~0.044 for 128 answers near 0.5, ~0.125 for 16)."""

from __future__ import annotations

import random

from tests.unit.runtime.watch_streams import SECONDS_PER_STEP

START_TIME = 1.79e9


def _reward(rng: random.Random, true: float, noise: float, answers: int | None) -> float:
    if answers is None:
        return true + rng.gauss(0, noise)
    p = min(1.0, max(0.0, true))
    return sum(rng.random() < p for _ in range(answers)) / answers


def _events(rewards: list[float]) -> list[dict]:
    return [{"event": "step", "step": s, "time": START_TIME + s * SECONDS_PER_STEP, "reward": r}
            for s, r in enumerate(rewards, 1)]


def slow_riser(seed: int, noise: float, gain_per_window: float = 0.05, window: int = 100,
               answers: int | None = None) -> list[dict]:
    """A run still gaining `gain_per_window` every `window` steps (the default: 2.5 x the default min_gain), in a
    straight line from 0.1-0.3 for 600-1,000 steps: never a plateau."""
    rng = random.Random(seed)
    steps, start = rng.randint(600, 1000), rng.uniform(0.1, 0.3)
    return _events([_reward(rng, start + gain_per_window * s / window, noise, answers) for s in range(1, steps + 1)])


def plateau_after_rise(seed: int, noise: float, flat: int = 600, answers: int | None = None) -> tuple[list[dict], int]:
    """watch_streams.plateaued()'s shape (a concave rise of 0.2-0.5 from 0.05-0.3 that turns flat at a random step
    60-200) with `flat` flat steps after the onset; returns the events and the onset."""
    rng = random.Random(seed)
    onset = rng.randint(60, 200)
    start, gain = rng.uniform(0.05, 0.3), rng.uniform(0.2, 0.5)
    rewards = [_reward(rng, start + gain * min(1.0, s / onset) ** 0.5, noise, answers)
               for s in range(1, onset + flat + 1)]
    return _events(rewards), onset
