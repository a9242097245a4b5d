"""`make test` as two pytest sessions side by side: the main lane (every selected test but one marker's) in the
foreground, as before, and the side lane (the tests of that marker: the verl cluster over two SSH test hosts) in the
background, its output in build/lane-<marker>.log. On 2 cores a verl start-up spends most of its minutes in one
Python process importing and initialising (one core busy), so the rest of the suite uses the other core meanwhile
(measured before it was adopted: docs/MEASUREMENTS.md, "CI holds every suite").

    python3 -m tests.lanes --side verl_cluster --prebuild cpu,verl-cpu,testhost -- -m "not gpu" -rs

--prebuild builds the named images once before the lanes start (two sessions must never build one tag at once; each
session's fixtures then find them current in seconds); it is skipped when the side lane selects no test. The exit
status is the main lane's when it failed, else the side lane's; the side lane's summary is printed at the end;
build/ci-phases.json and build/faults.json hold both lanes' rows (the side lane's marked as run beside the rest)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

BUILD = Path(__file__).resolve().parents[1] / "build"
IMAGES = ("cpu", "verl-cpu", "testhost")  # what --prebuild may name
SIDE_WAIT_S = 3600  # how long the side lane may still run once the main lane has ended
NO_TESTS = 5  # pytest's exit status when a session selected nothing
TAIL_LINES = 40


def side_expression(side: str) -> str:
    """`a,b` -> `(a or b)`: the side lane's markers as one expression."""
    names = side.split(",")
    return names[0] if len(names) == 1 else "(" + " or ".join(names) + ")"


def lane_args(args: list[str], side: str) -> tuple[list[str], list[str]]:
    """(main, side) pytest arguments: *args* with its -m expression (if any) joined to `not SIDE` and to `SIDE` (SIDE:
    one marker, or several comma-separated, any of which puts a test in the side lane)."""
    rest, expr, i = [], None, 0
    while i < len(args):
        arg = args[i]
        if arg == "-m" and i + 1 < len(args):
            expr, i = args[i + 1], i + 2
            continue
        if arg.startswith("-m") and len(arg) > 2 and not arg.startswith("-m-"):
            expr, i = arg[2:].lstrip("="), i + 1
            continue
        rest.append(arg)
        i += 1
    base, side = (f"({expr}) and " if expr else ""), side_expression(side)
    return [*rest, "-m", f"{base}not {side}"], [*rest, "-m", f"{base}{side}"]


def phases_path(lane: str | None) -> Path:
    return BUILD / ("ci-phases.json" if not lane else f"ci-phases-{lane}.json")


def faults_path(lane: str | None) -> Path:
    return BUILD / ("faults.json" if not lane else f"faults-{lane}.json")


def lane_of_environment() -> str | None:
    """GRPO_LANE as a file-name part, or None (the main lane, or a plain pytest run)."""
    lane = os.environ.get("GRPO_LANE", "")
    return lane if re.fullmatch(r"[a-z][a-z0-9_]{0,39}", lane) else None


def _read_json(path: Path, default):
    try:
        return json.loads(path.read_text()[: 1 << 20]) if path.is_file() and not path.is_symlink() else default
    except (OSError, ValueError):
        return default


def merge(side: str, side_wall_s: float, prebuild_s: float = 0.0) -> None:
    """Both lanes' phase rows into build/ci-phases.json (the images built before the lanes in a row of their own, the
    side lane's rows under one row of its wall time) and both lanes' fault rows into build/faults.json; the side lane's
    files are removed."""
    main = _read_json(phases_path(None), {"rows": []})
    theirs = _read_json(phases_path(side), {"rows": []})
    rows = main.get("rows", []) if isinstance(main, dict) else []
    if prebuild_s >= 1:
        rows.insert(0, {"phase": "image builds before the lanes (tests/lanes.py)", "seconds": round(prebuild_s, 1)})
    rows.append({"phase": f"side lane -m {side} (beside the rest; wall)", "seconds": round(side_wall_s, 1)})
    for row in theirs.get("rows", []) if isinstance(theirs, dict) else []:
        if isinstance(row, dict) and "phase" in row and "seconds" in row:
            rows.append({"phase": f"  {str(row['phase']).strip()}", "seconds": row["seconds"]})
    BUILD.mkdir(exist_ok=True)
    phases_path(None).write_text(json.dumps({**(main if isinstance(main, dict) else {}), "rows": rows}, indent=2))
    faults = [r for r in (_read_json(faults_path(None), []), _read_json(faults_path(side), [])) if isinstance(r, list)]
    if faults_path(side).is_file():
        faults_path(None).write_text(json.dumps([row for rows_ in faults for row in rows_], indent=2))
    for path in (phases_path(side), faults_path(side)):
        path.unlink(missing_ok=True)


def selects_tests(pytest_args: list[str]) -> bool:
    """Whether a pytest session with *pytest_args* would run anything (a collect-only pass: seconds)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *pytest_args],
                          capture_output=True, text=True, timeout=600)
    return proc.returncode == 0


def pytest_outcome() -> type[BaseException]:
    """pytest.fail's exception (a BaseException): what tests/ci_phases.built_once raises for a failed build."""
    from _pytest.outcomes import OutcomeException

    return OutcomeException


def prebuild(names: list[str]) -> None:
    """The named images built (or found current) once, before two sessions could build them at the same time."""
    from tests import kit_images, testhosts

    for name in names:
        start = time.monotonic()
        if name == "testhost":
            tag = testhosts.host_image()
        else:
            tag = kit_images.build(kit_images.client(), name)
        print(f"[lanes] image {tag} ready ({time.monotonic() - start:.0f} s)", flush=True)


def run(side: str, pytest_args: list[str], images: list[str]) -> int:
    main_args, side_args = lane_args(pytest_args, side)
    if not selects_tests(side_args):
        print(f"[lanes] no test of -m {side} is selected: one session", flush=True)
        return subprocess.run([sys.executable, "-m", "pytest", *main_args]).returncode
    prebuilt_s = time.monotonic()
    try:
        prebuild(images)
    except (Exception, pytest_outcome()) as exc:  # noqa: BLE001 - a failed build is one line, the run fails
        print(f"[lanes] an image build before the lanes failed: {str(exc).splitlines()[0] if str(exc) else exc!r}",
              flush=True)
        return 1
    prebuilt_s = time.monotonic() - prebuilt_s
    BUILD.mkdir(exist_ok=True)
    lane = side.replace(",", "_")[:40]
    log_path = BUILD / f"lane-{lane}.log"
    began = time.monotonic()
    with log_path.open("w") as log:
        side_proc = subprocess.Popen([sys.executable, "-m", "pytest", *side_args], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, "GRPO_LANE": lane})
    print(f"[lanes] the tests of -m {side} run beside the rest (pid {side_proc.pid}); their output: {log_path}",
          flush=True)
    try:
        main_rc = subprocess.run([sys.executable, "-m", "pytest", *main_args]).returncode
        if side_proc.poll() is None:
            print(f"[lanes] waiting for the side lane (-m {side}); its output: {log_path}", flush=True)
        side_rc = side_proc.wait(timeout=SIDE_WAIT_S)
    except KeyboardInterrupt:
        side_proc.send_signal(signal.SIGINT)
        side_proc.wait(timeout=120)
        return 130
    except subprocess.TimeoutExpired:
        side_proc.kill()
        side_rc = 1
        print(f"[lanes] the side lane ran {SIDE_WAIT_S} s past the main lane: killed", flush=True)
    merge(lane, time.monotonic() - began, prebuilt_s)
    tail = log_path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    print(f"\n[lanes] side lane -m {side}: exit {side_rc}; its last {len(tail)} lines ({log_path}):")
    print("\n".join(tail), flush=True)
    return main_rc if main_rc != 0 else side_rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.lanes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", required=True, help="the marker (or markers, comma-separated) whose tests run in the "
                                                       "side lane")
    parser.add_argument("--prebuild", default="", help=f"images built once first, comma-separated: {', '.join(IMAGES)}")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then pytest's arguments (both lanes)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,39}(,[a-z][a-z0-9_]{0,39}){0,7}", args.side):
        print(f"--side: {args.side!r} is not a marker name or a comma-separated list of them (lower-case letters, "
              "digits, _)", file=sys.stderr)
        return 2
    images = [name for name in args.prebuild.split(",") if name]
    unknown = [name for name in images if name not in IMAGES]
    if unknown:
        print(f"--prebuild: {', '.join(unknown)} unknown; one of {', '.join(IMAGES)}", file=sys.stderr)
        return 2
    rest = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    return run(args.side, rest, images)


if __name__ == "__main__":
    sys.exit(main())
