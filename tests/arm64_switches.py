"""The trainer speed switches on arm64 (issue 24: a switch is kept only if it works on arm64): `bench trainer --tiny`
with every switch, run inside the arm64 trainer image (recipe cuda-trainer-arm64) on this x86_64 machine under QEMU
user emulation, on the CPU. The checkout's runtime code is mounted over the image's, so the code under test is this
commit's; the image supplies the arm64 wheels (torch, transformers, PEFT, TRL) and g++ for Inductor's CPU backend.

What this shows and what it cannot: the switches' own code (bf16 casts, the elementwise LoRA forward, Dynamo tracing
each decoder layer around the attention shim, Inductor's aarch64 C++ code, recompiles, exactness under bf16 autocast)
runs on the arm64 builds of the pinned packages. A GB10 compiles for its GPU with Triton instead, and a time taken
under emulation says nothing about speed: this is evidence that the switches work, never that they win.

`make test-arm64-switches` runs tests/integration/test_arm64_switches.py and then `python -m tests.arm64_switches
--record` writes images/cuda/arm64-switches.txt from the report the test left in the build folder (commit it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from grpo_deploy.image_build import places

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "cuda-trainer-arm64"
RECORD = ROOT / "images" / "cuda" / "arm64-switches.txt"
# Each switch at least once, and the h200 profile's combination. Compile appears only with lora-ew (which needs it):
# each compiled row is a cold compile whose g++ runs emulated, many minutes each.
ROWS = "today;bf16-linear;bf16;liger;compile+lora-ew;bf16+compile+lora-ew"
KIT_MOUNT = "/opt/grpo-deploy/checkout"
OUT_MOUNT = "/out"


# qemu-user emulates its "max" CPU unless told: SVE with 256-bit vectors among much else, so Inductor picks its SVE256
# C++ code, and gcc 12.2 (Debian bookworm, the image's) then dies compiling torch's SVE headers (an internal compiler
# error in aarch64_sve::gimple_folder::convert_pred, first run of 2026-12-04). Without SVE Inductor leaves SVE256 out,
# as on a core with 128-bit SVE such as a GB10's or Grace's.
ENVIRONMENT = {"PYTHONPATH": KIT_MOUNT, "PYTHONDONTWRITEBYTECODE": "1", "QEMU_CPU": "max,sve=off"}


def bench_argv(out: str) -> list[str]:
    """The tiny bench as the CPU test runs it (tests/unit/runtime/bench/test_trainer.py), every switch row, without
    the packing table, the attention paths and the profiler's breakdown (no switch in them; under emulation they
    would double the time)."""
    return ["python3", "-m", "grpo_deploy.runtime.bench.trainer", "--tiny", "--device", "cpu", "--speed-only",
            "--skip-attention", "--breakdown", "", "--speed-rows", ROWS, "--out", out]


def report_path() -> Path:
    return places.build_dir() / "arm64-switches" / "report.json"


def verdicts(report: dict) -> list[tuple[str, str, str]]:
    """Per switch combination: (label, timed row, exactness row), each 'runs ...' / 'exact ...' / the reason."""
    checked = {r["switches"]: r for r in report.get("exactness", {}).get("rows", [])}
    lines = []
    for row in report["speed"]:
        if "skipped" in row or "failure" in row:
            timed = f"not timed: {row.get('skipped') or row['failure']}"
        else:
            timed = (f"runs: {row['seconds']:.2f} s/step, compile {row['compile_s']:.1f} s, {row['graphs_warmup']} "
                     f"graphs, {row['recompiles_in_step']} recompiles in step")
        check = checked.get(row["switches"])
        if check is None:
            verdict = "not checked"
        elif "skipped" in check:
            verdict = f"not runnable: {check['skipped']}"
        elif "failure" in check:
            verdict = f"FAILED in the exactness step: {check['failure']}"
        else:
            verdict = (f"{'exact' if check['exact'] else 'NOT EXACT'} under bf16 autocast: loss "
                       f"{check['vs_fp32']['loss']:.1e}, LoRA grads {check['vs_fp32']['grad']:.1e} vs fp32 "
                       f"(tolerance {check['tolerance']['loss']:.1e} / {check['tolerance']['grad']:.1e})")
        lines.append((row["switches"], timed, verdict))
    return lines


def record(report: dict, wall_s: float | None) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip() or "unknown"
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
    head = [f"# The trainer speed switches inside the arm64 trainer image ({RECIPE}) under QEMU user emulation, on",
            "# the CPU: `bench trainer --tiny` with every switch. Evidence that each switch works on arm64 (the",
            "# pinned packages' aarch64 builds, Inductor's C++ backend), not that it wins: emulated times say nothing",
            "# about a GB10, which compiles with Triton for its GPU. Written by `make test-arm64-switches`",
            "# (tests/arm64_switches.py); commit it.",
            f"verified {report['date']} at {commit}, machine {report['machine']}, device {report['device']}, "
            f"CPU capability {report.get('cpu_capability')}, QEMU_CPU={ENVIRONMENT['QEMU_CPU']}",
            f"versions {versions}",
            f"rows {ROWS}"]
    if wall_s is not None:
        head.append(f"bench wall {wall_s:.0f} s under emulation")
    body = [f"{label}: {timed}; {verdict}" for label, timed, verdict in verdicts(report)]
    return "\n".join(head + body) + "\n"


def main(argv: list[str]) -> int:
    if argv != ["--record"]:
        print("usage: python -m tests.arm64_switches --record", file=sys.stderr)
        return 2
    path = report_path()
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        print(f"no bench report at {path} ({error}): run the test first (make test-arm64-switches)", file=sys.stderr)
        return 1
    wall = path.with_name("wall_s")
    RECORD.write_text(record(report, float(wall.read_text()) if wall.exists() else None))
    print(f"recorded {RECORD.relative_to(ROOT)} ({time.strftime('%Y-%m-%d')})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
