"""Benchmark: the run watcher's plateau alarm on seeded metric streams — at the default settings on seed-shaped streams
(tests/unit/runtime/watch_streams.py, noise 0.01-0.03): the false-alarm rate on still-rising streams (target: under
1%), the detection delay on plateaued ones (steps from the true onset to the warning), seed 000's curve and a few
window sizes; then across per-step noise 0.02-0.12 (tests/unit/runtime/watch/noisy_streams.py, and steps that are means
of 128 or 16 binary answers): false alarms on rising streams and slow risers (2.5 x min_gain per window; target: at most
1 in 20 at every noise level) and the plateau's delay in steps and windows (target: p95 at most 2.5 windows at noise
0.05). Prints its numbers; it is not a test (tests/unit/runtime/watch/ holds the bounds). Exit 1 when a target fails.

Run: python3 benchmarks/watcher_alarms.py [--streams 1000] [--sweep-streams 200]   (make bench-watcher; ~1.5 min on 2
cores)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from grpo_deploy.runtime.watch.config import MetricKeys, WatchConfig, WatchSettings  # noqa: E402
from grpo_deploy.runtime.watch.watcher import Finding, Watcher  # noqa: E402
from tests.unit.runtime import watch_streams  # noqa: E402
from tests.unit.runtime.watch import noisy_streams  # noqa: E402

TARGET_FALSE_ALARMS = 0.01
TARGET_SWEEP_FALSE_ALARMS = 1 / 20
TARGET_P95_WINDOWS, TARGET_P95_NOISE = 2.5, 0.05
NOISE_LEVELS = (0.02, 0.05, 0.08, 0.12)
ANSWERS = (128, 16)


def warning(events: list[dict], settings: WatchSettings, validation: str | None = None) -> Finding | None:
    """The first plateau warning over a stream, or None."""
    watcher = Watcher(WatchConfig(settings=settings, keys=MetricKeys(validation=validation)))
    for event in events:
        for finding in watcher.observe(event["step"], event, event["time"]):
            if finding.kind == "plateau" and finding.level == "warn":
                return finding
    return None


def first_warning(events: list[dict], settings: WatchSettings, validation: str | None = None) -> int | None:
    """The step of the first plateau warning over a stream, or None."""
    found = warning(events, settings, validation)
    return found.step if found else None


def false_alarms(streams: int, settings: WatchSettings) -> int:
    return sum(first_warning(watch_streams.rising(seed, settings.min_gain, settings.window), settings) is not None
               for seed in range(streams))


def delays(streams: int, settings: WatchSettings) -> tuple[list[int], int]:
    """Steps from the true onset to the warning for each plateaued stream that warned, and how many never did."""
    out, missed = [], 0
    for seed in range(streams):
        events, onset = watch_streams.plateaued(seed)
        step = first_warning(events, settings)
        if step is None:
            missed += 1
        else:
            out.append(step - onset)
    return out, missed


def p95(values: list[int]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else float("nan")


def defaults_part(streams: int, defaults: WatchSettings) -> int:
    """The seed-shaped streams at the defaults, seed 000's curve and three window sizes; returns the false alarms."""
    print(f"defaults: window {defaults.window}, min_gain {defaults.min_gain:g} per window, patience "
          f"{defaults.patience}; {streams} seeded streams each, per-step noise 0.01-0.03")
    alarms = false_alarms(streams, defaults)
    print(f"false alarms on rising streams: {alarms}/{streams} = {alarms / streams:.2%} "
          f"(target under {TARGET_FALSE_ALARMS:.0%})")
    found, missed = delays(streams, defaults)
    print(f"plateau detection delay (steps after the true onset): median {statistics.median(found):.0f}, p95 "
          f"{p95(found):.0f}, max {max(found)}; missed {missed}/{streams}")
    seed000 = [first_warning(watch_streams.seed000(seed)[0], defaults) for seed in range(200)]
    caught = [s for s in seed000 if s is not None]
    if caught:
        stop = statistics.median(caught) + defaults.patience
        print(f"seed 000's curve (onset step 90 of 450): flagged {len(caught)}/200, median warning at step "
              f"{statistics.median(caught):.0f}; a stop {defaults.patience} steps later (step {stop:.0f}) saves "
              f"{450 - stop:.0f} of 450 steps ({(450 - stop) / 450:.0%})")
    else:
        print("seed 000's curve: never flagged")
    n = max(streams // 2, 100)
    print(f"\n{'window':>6} {'min_gain':>8} {'false alarms':>14} {'delay median':>12} {'p95':>5} {'missed':>7}"
          f"   ({n} streams each; min_gain scaled to the same slope)")
    for window in (50, 100, 150):
        settings = WatchSettings(window=window, min_gain=defaults.min_gain * window / defaults.window)
        windowed_alarms = false_alarms(n, settings)
        found, missed = delays(n, settings)
        print(f"{window:>6} {settings.min_gain:>8.3f} {f'{windowed_alarms}/{n}':>14} "
              f"{statistics.median(found):>12.0f} {p95(found):>5.0f} {f'{missed}/{n}':>7}")
    return alarms


def sweep_row(label: str, streams: int, settings: WatchSettings, noise: float, answers: int | None) -> dict:
    """One noise level: false alarms on rising and slow-rising streams, the plateau's delay and the stretch fitted."""
    rising = None  # watch_streams.rising has no binary form: binary rows count the slow risers only
    if answers is None:
        rising = sum(warning(watch_streams.rising(seed, settings.min_gain, settings.window, noise), settings)
                     is not None for seed in range(streams))
    slow = sum(warning(noisy_streams.slow_riser(seed, noise, 2.5 * settings.min_gain, settings.window, answers),
                       settings) is not None for seed in range(streams))
    found, stretches, missed = [], [], 0
    for seed in range(streams):
        events, onset = noisy_streams.plateau_after_rise(seed, noise, answers=answers)
        warned = warning(events, settings)
        if warned is None:
            missed += 1
        else:
            found.append(warned.step - onset)
            stretches.append(warned.values["steps_fitted"])
    w = settings.window
    median, tail, worst = statistics.median(found), p95(found), max(found)
    rising_text = f"{rising}/{streams}" if rising is not None else "-"
    print(f"{label:>14} {statistics.median(stretches):>7.0f} {rising_text:>9} {f'{slow}/{streams}':>9} "
          f"{median:>6.0f} {tail:>5.0f} {worst:>5} {median / w:>7.2f} {tail / w:>5.2f} {worst / w:>5.2f} "
          f"{f'{missed}/{streams}':>7}")
    return {"noise": noise, "false": max(rising or 0, slow), "streams": streams, "p95_windows": tail / w}


def sweep_part(streams: int, defaults: WatchSettings) -> bool:
    """The noise sweep at the defaults; returns whether its targets hold."""
    print(f"\nacross per-step noise at the defaults; {streams} streams of each kind per level (binary rows "
          f"{max(streams // 2, 20)}; fewer than above, to keep the run short):\n"
          "  rising = watch_streams.rising (300-600 steps, slope at least 2 x min_gain); slow = a straight climb of "
          "2.5 x min_gain per window\n  for 600-1,000 steps; plateau = a rise that turns flat at step 60-200, then 600 "
          "flat steps;\n  'N answers': each step the mean of N binary answers (noise sqrt(p(1-p)/N): ~0.044 for 128 "
          "near 0.5, ~0.125 for 16)")
    print(f"{'noise/step':>14} {'stretch':>7} {'rising':>9} {'slow':>9} {'delay':>6} {'p95':>5} {'max':>5} "
          f"{'windows':>7} {'p95':>5} {'max':>5} {'missed':>7}")
    rows = [sweep_row(f"{noise:g}", streams, defaults, noise, None) for noise in NOISE_LEVELS]
    for answers in ANSWERS:
        rows.append(sweep_row(f"{answers} answers", max(streams // 2, 20), defaults, 0.0, answers))
    worst = max(rows, key=lambda r: r["false"] / r["streams"])
    at_target = [r for r in rows if r["noise"] == TARGET_P95_NOISE][0]
    held = worst["false"] / worst["streams"] <= TARGET_SWEEP_FALSE_ALARMS and \
        at_target["p95_windows"] <= TARGET_P95_WINDOWS
    print(f"(stretch: the median steps fitted at the warning; delay in steps after the true onset, then in windows)\n"
          f"targets: false alarms at most 1 in 20 at every level (worst {worst['false']}/{worst['streams']}); plateau "
          f"p95 at most {TARGET_P95_WINDOWS:g} windows at noise {TARGET_P95_NOISE:g} "
          f"({at_target['p95_windows']:.2f}): {'held' if held else 'NOT held'}")
    return held


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000, help="seeded streams per measurement at the defaults")
    parser.add_argument("--sweep-streams", type=int, default=200, help="seeded streams of each kind per noise level")
    args = parser.parse_args()
    started = time.monotonic()
    defaults = WatchSettings()
    alarms = defaults_part(args.streams, defaults)
    held = sweep_part(args.sweep_streams, defaults)
    print(f"\n({time.monotonic() - started:.1f} s)")
    return 0 if alarms / args.streams < TARGET_FALSE_ALARMS and held else 1


if __name__ == "__main__":
    sys.exit(main())
