"""Benchmark: the two engines' CPU rehearsals on the same machine — `grpo-deploy up` -> first step and the median
seconds per step of the TRL rehearsal (`init --profile cpu`) and the verl rehearsal (`init --profile cpu --engine
verl`), image building left out (as `up`'s summary counts it). Prints its numbers; it is not a test.

    python3 benchmarks/engines_rehearsal.py             # runs both `up --fresh` in scratch folders, one after the other
    python3 benchmarks/engines_rehearsal.py --trl DIR --verl DIR   # reads the summary.json of runs already made
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENGINES = {"trl": "trl-async", "verl": "verl"}


def run_up(engine: str, folder: Path) -> Path:
    """`init --profile cpu --engine ENGINE --name bench-ENGINE` then `up --fresh` in *folder*; its summary.json."""
    name = f"bench-{engine.replace('-', '')}"
    cli = [sys.executable, "-m", "grpo_deploy.cli"]
    subprocess.run([*cli, "init", "--profile", "cpu", "--engine", engine, "--name", name], cwd=folder, check=True,
                   capture_output=True, timeout=120)
    start = time.time()
    proc = subprocess.run([*cli, "up", "--fresh"], cwd=folder, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{engine}: up exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    print(f"{engine}: up took {time.time() - start:.0f} s", flush=True)
    return folder / ".grpo-deploy" / name / "summary.json"


def figures(summary: Path) -> dict:
    s = json.loads(summary.read_text())
    return {"steps": s["steps"], "up_to_first_step_s": s["up_to_first_step_s"],
            "step_time_median_s": s["step_time_median_s"], "reward": (s["reward_first5"], s["reward_last5"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trl", type=Path, help="a folder with a finished TRL rehearsal (.grpo-deploy/*/summary.json)")
    parser.add_argument("--verl", type=Path, help="a folder with a finished verl rehearsal")
    args = parser.parse_args(argv)
    summaries = {}
    with tempfile.TemporaryDirectory(prefix="grpo-bench-engines-") as tmp:
        for key, engine in ENGINES.items():
            given = getattr(args, key)
            if given is not None:
                found = sorted(given.glob(".grpo-deploy/*/summary.json"))
                if not found:
                    raise SystemExit(f"--{key} {given}: no .grpo-deploy/*/summary.json there")
                summaries[key] = found[-1]
            else:
                folder = Path(tmp) / key
                folder.mkdir()
                summaries[key] = run_up(engine, folder)
        rows = {key: figures(path) for key, path in summaries.items()}
    print(f"{'engine':<6} {'steps':>5} {'up -> first step':>17} {'median step':>12}  reward first 5 -> last 5")
    for key, f in rows.items():
        first, last = f["reward"]
        print(f"{key:<6} {f['steps']:>5} {f['up_to_first_step_s']:>15.1f} s {f['step_time_median_s']:>10.2f} s  "
              f"{first:.3f} -> {last:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
