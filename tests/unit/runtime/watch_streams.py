"""Seeded metric streams shaped like the field runs, for the watcher's tests and benchmarks/watcher_alarms.py: each
a list of metrics events ({"event": "step", "step", "time", ...}) as the runtime writes them, with noise."""

from __future__ import annotations

import math
import random

SECONDS_PER_STEP = 60.0


def _step(step: int, t0: float, **metrics: float) -> dict:
    return {"event": "step", "step": step, "time": t0 + step * SECONDS_PER_STEP, **metrics}


def seed000(seed: int, steps_per_epoch: int = 30, epochs: int = 15, noise: float = 0.02) -> tuple[list[dict], int]:
    """Seed 000's curve: ~83% after 3 of 15 epochs (a concave rise from 30%), then only +2% over the other 12 epochs;
    a validation score every 10 steps (noise 0.01). Returns the events and the true plateau onset (end of epoch 3)."""
    rng = random.Random(seed)
    onset, total = 3 * steps_per_epoch, epochs * steps_per_epoch
    events = []
    for s in range(1, total + 1):
        true = 0.83 - 0.53 * (1 - s / onset) ** 2 if s < onset else 0.83 + 0.02 * (s - onset) / (total - onset)
        metrics = {"reward": min(1.0, max(0.0, true + rng.gauss(0, noise)))}
        if s % 10 == 0:
            metrics["val/accuracy"] = true + rng.gauss(0, 0.01)
        events.append(_step(s, 1.79e9, **metrics))
    return events, onset


def plateaued(seed: int, noise: float | None = None) -> tuple[list[dict], int]:
    """A rise (exponential approach, random height and rate) that turns flat at a random onset, then stays flat for
    300 steps; returns the events and the onset."""
    rng = random.Random(seed)
    onset = rng.randint(60, 200)
    noise = rng.uniform(0.01, 0.03) if noise is None else noise
    start, gain = rng.uniform(0.05, 0.3), rng.uniform(0.2, 0.5)
    events = []
    for s in range(1, onset + 301):
        true = start + gain * min(1.0, s / onset) ** 0.5
        events.append(_step(s, 1.79e9, reward=true + rng.gauss(0, noise)))
    return events, onset


def rising(seed: int, min_gain: float = 0.02, window: int = 100, noise: float | None = None) -> list[dict]:
    """Still rising: a concave climb whose slope never falls below twice the flat threshold (min_gain per window),
    over 300-600 steps, noise 0.01-0.03 per step."""
    rng = random.Random(seed)
    total = rng.randint(300, 600)
    noise = rng.uniform(0.01, 0.03) if noise is None else noise
    floor = 2 * min_gain / window  # the slope at the end, per step
    extra = rng.uniform(0.0, 0.3)  # the gain of the concave part above the floor
    start = rng.uniform(0.05, 0.3)
    return [_step(s, 1.79e9, reward=start + floor * s + extra * math.sqrt(s / total) + rng.gauss(0, noise))
            for s in range(1, total + 1)]


def seed004(seed: int, cap: int = 3000) -> list[dict]:
    """Seed 004's baseline (per-answer loss): length 1,340 -> peak 1,650 at step 130 -> 1,230 at step 500, ~30% of
    answers at the 3,000-token cap at the peak, 15% at the end; reward 0.20 -> 0.43 (128 answers a step)."""
    rng = random.Random(seed)
    events = []
    for s in range(1, 501):
        length = 1340 + 310 * s / 130 if s <= 130 else 1650 - 420 * (s - 130) / 370
        share = 0.12 + 0.18 * s / 130 if s <= 130 else 0.30 - 0.15 * (s - 130) / 370
        capped = sum(rng.random() < share for _ in range(128)) / 128
        reward = 0.2 + 0.23 * (1 - math.exp(-s / 150))
        events.append(_step(s, 1.79e9, reward=reward + rng.gauss(0, 0.04), **{
            "completions/mean_length": length + rng.gauss(0, 40), "completions/clipped_ratio": capped,
            "batch/samples_per_step": 128.0}))
    return events


def packed_pair(seed: int) -> tuple[list[dict], list[dict]]:
    """Seed 004's baseline attempt (per-answer mean, answers growing) up to step 100, then a resume from step 80 with
    packing on (per-token over packed rows, answers shrinking from 1,100 to 920): each attempt's events, its run_start
    first (the objective named as the runtime would)."""
    rng = random.Random(seed)
    first = [{"event": "run_start", "time": 1.79e9, "objective": "per-answer mean"}]
    first += [_step(s, 1.79e9, reward=0.2 + 0.001 * s + rng.gauss(0, 0.03),
                    **{"completions/mean_length": 1340 + 2.4 * s + rng.gauss(0, 30)}) for s in range(1, 101)]
    t1 = 1.79e9 + 200 * SECONDS_PER_STEP
    second = [{"event": "run_start", "time": t1, "objective": "per-token over packed rows"}]
    second += [_step(s, t1, reward=0.2 + 0.001 * s + rng.gauss(0, 0.03),
                     **{"completions/mean_length": 1100 - 0.4 * s + rng.gauss(0, 30)}) for s in range(80, 301)]
    return first, second
