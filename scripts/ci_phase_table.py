"""The phase-time table .ci/run prints at its end: its own phases (setup, tests, demo, bench) from a TSV it wrote,
the test session's rows (each test directory, image builds) from build/ci-phases.json, and the total."""

from __future__ import annotations

import json
import sys
from pathlib import Path

MAX_BYTES = 1 << 20


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def read_phases(path: Path) -> list[tuple[str, float, str]]:
    rows = []
    if path.is_file():
        for line in path.read_text(errors="replace")[:MAX_BYTES].splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[1].isdigit():
                rows.append((parts[0], float(parts[1]), "ok" if parts[2] == "0" else f"exit {parts[2]}"))
    return rows


def read_tests(path: Path) -> list[tuple[str, float]]:
    try:
        data = json.loads(path.read_text()[:MAX_BYTES]) if path.is_file() else {}
        return [(str(r["phase"]), float(r["seconds"])) for r in data.get("rows", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def table(phases: list[tuple[str, float, str]], tests: list[tuple[str, float]]) -> str:
    total = sum(s for _, s, _ in phases)
    lines = [f"{'phase':<58} {'m:ss':>7} {'share':>6}  outcome"]
    for name, seconds, outcome in phases:
        lines.append(f"{name:<58} {minutes(seconds):>7} {seconds / total if total else 0:>6.0%}  {outcome}")
        if name == "test":
            for sub, sub_s in tests:
                lines.append(f"  {sub:<56} {minutes(sub_s):>7} {sub_s / total if total else 0:>6.0%}")
    lines.append(f"{'total':<58} {minutes(total):>7}")
    return "\n".join(lines)


if __name__ == "__main__":
    tsv, tests_json = Path(sys.argv[1]), Path(sys.argv[2])
    print("\n== CI phase times ==")
    print(table(read_phases(tsv), read_tests(tests_json)))
