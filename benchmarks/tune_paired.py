"""Benchmark: does a tuned spec reach a target reward sooner than the spec it came from? Paired real runs, interleaved
(A, B, A, B, ...): `grpo-deploy up --fresh` of each spec in a scratch folder of its own, then from the run's own
metrics the wall time from `up`'s start to the first step whose 5-step mean reward reaches the target, and the run
watcher's estimate of that time made at the step half-way to it (checked against when it happened). Prints its
numbers; it is not a test.

    python3 benchmarks/tune_paired.py --before grpo-deploy.yaml.before-tune --after grpo-deploy.yaml --target 0.5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.runtime.watch.series import fit

SMOOTH = 5  # steps averaged before the target counts as reached


def reached(events: list[dict], target: float, started: float) -> tuple[float | None, int | None, float | None]:
    """(seconds from *started* to the first step whose SMOOTH-step mean reward is >= target, that step, the line-fit
    estimate of the same seconds made from the steps up to half-way)."""
    steps = sorted((e for e in events if e.get("event") == "step" and isinstance(e.get("reward"), int | float)),
                   key=lambda e: e["time"])
    for i in range(SMOOTH - 1, len(steps)):
        window = [s["reward"] for s in steps[i - SMOOTH + 1:i + 1]]
        if sum(window) / SMOOTH >= target:
            half = steps[: max(SMOOTH, (i + 1) // 2)]
            line = fit((s["time"] - started, s["reward"]) for s in half)
            estimate = None
            if line is not None and line.slope > 0:
                last = half[-1]["time"] - started
                estimate = last + (target - line.end) / line.slope
            return steps[i]["time"] - started, int(steps[i]["step"]), estimate
    return None, None, None


def one_run(spec: Path, folder: Path, target: float) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    run = yaml.safe_load(spec.read_text())["run"]["name"]
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "up", "-f", str(spec.resolve()), "--fresh"],
                          cwd=folder, capture_output=True, text=True, timeout=3600)
    (folder / "up.log").write_text(proc.stdout + proc.stderr)
    metrics = folder / ".grpo-deploy" / run / "metrics.jsonl"
    events = parse_events(metrics.read_text()) if metrics.is_file() else []
    seconds, step, estimate = reached(events, target, started)
    return {"spec": spec.name, "exit": proc.returncode, "seconds": seconds, "step": step, "estimate": estimate,
            "wall": time.time() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the spec before tuning")
    parser.add_argument("--after", type=Path, required=True, help="the tuned spec")
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("build/tune-paired"))
    args = parser.parse_args()
    results = {"before": [], "after": []}
    for i in range(args.pairs):
        for name, spec in (("before", args.before), ("after", args.after)):
            got = one_run(spec, args.out / f"{name}-{i + 1}", args.target)
            results[name].append(got)
            est = "-" if got["estimate"] is None else f"{got['estimate']:.0f} s"
            print(f"pair {i + 1} {name:6}: exit {got['exit']}, reward {args.target:g} (5-step mean) after "
                  f"{'-' if got['seconds'] is None else format(got['seconds'], '.0f')} s at step {got['step']}; "
                  f"the line's estimate at half-way {est}; run {got['wall']:.0f} s", flush=True)
    print()
    for name in ("before", "after"):
        times = [r["seconds"] for r in results[name] if r["seconds"] is not None]
        med = f"{statistics.median(times):.0f} s" if times else "never reached"
        print(f"{name:6}: reached in {len(times)}/{args.pairs} runs, median {med}: {[round(t) for t in times]}")
    wins = sum(1 for b, a in zip(results["before"], results["after"], strict=True)
               if a["seconds"] is not None and (b["seconds"] is None or a["seconds"] < b["seconds"]))
    print(f"the tuned spec was sooner in {wins} of {args.pairs} pairs")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
