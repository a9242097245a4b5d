"""Benchmark: the run watcher's plateau alarm on seeded, seed-shaped metric streams (tests/unit/runtime/
watch_streams.py) at the default settings — the false-alarm rate on still-rising streams (target: under 1%), the
detection delay on plateaued ones (steps from the true onset to the warning) and seed 000's curve — then the same over
a few window sizes. Prints its numbers; it is not a test (tests/unit/runtime/watch/test_watcher.py holds the bounds).

Run: python3 benchmarks/watcher_alarms.py [--streams 1000]   (make bench-watcher; about 15 s on 2 cores)
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
from grpo_deploy.runtime.watch.watcher import Watcher  # noqa: E402
from tests.unit.runtime import watch_streams  # noqa: E402

TARGET_FALSE_ALARMS = 0.01


def first_warning(events: list[dict], settings: WatchSettings, validation: str | None = None) -> int | None:
    """The step of the first plateau warning over a stream, or None."""
    watcher = Watcher(WatchConfig(settings=settings, keys=MetricKeys(validation=validation)))
    for event in events:
        for finding in watcher.observe(event["step"], event, event["time"]):
            if finding.kind == "plateau" and finding.level == "warn":
                return finding.step
    return None


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000, help="seeded streams per measurement")
    args = parser.parse_args()
    started = time.monotonic()
    defaults = WatchSettings()
    print(f"defaults: window {defaults.window}, min_gain {defaults.min_gain:g} per window, patience "
          f"{defaults.patience}; {args.streams} seeded streams each")
    default_alarms = alarms = false_alarms(args.streams, defaults)
    print(f"false alarms on rising streams: {alarms}/{args.streams} = {alarms / args.streams:.2%} "
          f"(target under {TARGET_FALSE_ALARMS:.0%})")
    found, missed = delays(args.streams, defaults)
    print(f"plateau detection delay (steps after the true onset): median {statistics.median(found):.0f}, p95 "
          f"{p95(found):.0f}, max {max(found)}; missed {missed}/{args.streams}")
    seed000 = [first_warning(watch_streams.seed000(seed)[0], defaults) for seed in range(200)]
    caught = [s for s in seed000 if s is not None]
    if caught:
        stop = statistics.median(caught) + defaults.patience
        print(f"seed 000's curve (onset step 90 of 450): flagged {len(caught)}/200, median warning at step "
              f"{statistics.median(caught):.0f}; a stop {defaults.patience} steps later (step {stop:.0f}) saves "
              f"{450 - stop:.0f} of 450 steps ({(450 - stop) / 450:.0%})")
    else:
        print("seed 000's curve: never flagged")
    print(f"\n{'window':>6} {'min_gain':>8} {'false alarms':>14} {'delay median':>12} {'p95':>5} {'missed':>7}")
    for window in (50, 100, 150):
        settings = WatchSettings(window=window, min_gain=defaults.min_gain * window / defaults.window)
        n = max(args.streams // 2, 100)
        alarms = false_alarms(n, settings)
        found, missed = delays(n, settings)
        print(f"{window:>6} {settings.min_gain:>8.3f} {f'{alarms}/{n}':>14} {statistics.median(found):>12.0f} "
              f"{p95(found):>5.0f} {f'{missed}/{n}':>7}")
    print(f"\n({time.monotonic() - started:.1f} s)")
    return 0 if default_alarms / args.streams < TARGET_FALSE_ALARMS else 1


if __name__ == "__main__":
    sys.exit(main())
