"""Where a test session's time went, for .ci/run's phase table: wall seconds per test directory (setup, call and
teardown of its tests), under each directory its test modules of MODULE_MIN_S or more (the rest in one line), image
builds as rows of their own (taken out of the directory and the module whose test waited for them),
and images that a session builds at most once (`built_once`: a failure is reported in full by the first test that
needed the image and in one line by every later one). Written to build/ci-phases.json at the end of the session;
`make test` runs two sessions (the fast tiers on parallel workers, then the rest) and the second adds its rows to the
first's (`write(append=True)`). A session on parallel workers is one row of its wall time, its directories' summed
test times under it."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

OUT = Path(__file__).resolve().parents[1] / "build" / "ci-phases.json"
T = TypeVar("T")
COLLECTION = "pytest: collection and session teardown"  # the row of what no test's time holds
MAX_BYTES = 1 << 20  # an earlier session's table is read no further

MODULE_MIN_S = 30.0  # a test module's own row from this many seconds; the budget goes to these
_directory_s: dict[str, float] = defaultdict(float)
_module_s: dict[str, float] = defaultdict(float)
_builds: list[dict] = []
_current: list[str] = []  # the directory and module of the test being run (a build's time is taken out of them)
_started = time.monotonic()


def directory_of(nodeid: str) -> str:
    """tests/faults/test_x.py::test_y -> tests/faults; a test file directly under tests/ -> tests."""
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def module_of(nodeid: str) -> str:
    """tests/faults/test_x.py::test_y[a] -> tests/faults/test_x.py"""
    return nodeid.split("::", 1)[0]


def running(nodeid: str) -> None:
    _current[:] = [directory_of(nodeid), module_of(nodeid)]


def add_report(report) -> None:
    _directory_s[directory_of(report.nodeid)] += report.duration
    _module_s[module_of(report.nodeid)] += report.duration


def record_build(name: str, seconds: float) -> None:
    """An image build that took *seconds* of wall time, taken out of the directory and module whose test waited."""
    within, module = (_current + [None, None])[:2]
    _builds.append({"phase": f"image build: {name}", "seconds": round(seconds, 1), "within": within, "module": module})


def _module_rows(directory: str, modules: dict[str, float]) -> list[dict]:
    """The directory's modules of MODULE_MIN_S or more, slowest first, indented; the others in one row."""
    mine = sorted(((m, s) for m, s in modules.items() if directory_of(m + "::x") == directory), key=lambda ms: -ms[1])
    rows = [{"phase": f"  {m}", "seconds": round(s, 1)} for m, s in mine if s >= MODULE_MIN_S]
    rest = [s for _, s in mine if s < MODULE_MIN_S]
    if rest and rows:
        rows.append({"phase": f"  {len(rest)} other module(s) under {MODULE_MIN_S:g} s each",
                     "seconds": round(sum(rest), 1)})
    return rows


def rows() -> list[dict]:
    """The table's rows: each directory less the builds it waited for, then the builds, then what is left of the
    session's wall time (collection, session fixtures' teardown)."""
    out = {d: s for d, s in _directory_s.items()}
    modules = {m: s for m, s in _module_s.items()}
    for build in _builds:
        if build["within"] in out:
            out[build["within"]] -= build["seconds"]
        if build.get("module") in modules:
            modules[build["module"]] -= build["seconds"]
    table = []
    for d, s in sorted(out.items()):
        table += [{"phase": d, "seconds": round(s, 1)}, *_module_rows(d, modules)]
    table += [{"phase": b["phase"], "seconds": b["seconds"]} for b in _builds]
    wall = time.monotonic() - _started
    counted = sum(_directory_s.values()) + sum(b["seconds"] for b in _builds if b["within"] is None)
    table.append({"phase": COLLECTION, "seconds": round(max(0.0, wall - counted), 1)})
    return table


def parallel_rows(workers: int) -> list[dict]:
    """A session on *workers* parallel workers: one row of its wall time (the directories it ran named), under it each
    directory's test time summed over the workers (more than the wall time: they ran side by side)."""
    wall = time.monotonic() - _started
    dirs = sorted(_directory_s)
    return [{"phase": f"{', '.join(dirs) or 'no tests'} ({workers} workers side by side)", "seconds": round(wall, 1)},
            *({"phase": f"  {d}: test time summed over the workers", "seconds": round(_directory_s[d], 1)}
              for d in dirs)]


def merged(earlier: list[dict], later: list[dict]) -> list[dict]:
    """An earlier session's rows, then a later one's; the two collection rows summed into one, last."""
    rest = [r for r in earlier + later if r.get("phase") != COLLECTION]
    collection = sum(float(r.get("seconds", 0)) for r in earlier + later if r.get("phase") == COLLECTION)
    return rest + ([{"phase": COLLECTION, "seconds": round(collection, 1)}] if collection else [])


def read_earlier() -> tuple[float, list[dict]]:
    """The wall seconds and rows an earlier session of the same `make test` wrote (nothing when none, or unreadable)."""
    try:
        if not OUT.is_file() or OUT.is_symlink():
            return 0.0, []
        with OUT.open("rb") as handle:
            data = json.loads(handle.read(MAX_BYTES).decode(errors="replace"))
        return float(data.get("wall_seconds", 0)), [dict(r) for r in data.get("rows", []) if isinstance(r, dict)]
    except (ValueError, TypeError, AttributeError, OSError):
        return 0.0, []


def write(workers: int = 1, append: bool = False) -> None:
    """build/ci-phases.json: this session's rows (one wall-time row when it ran on parallel *workers*), after an
    earlier session's when *append*."""
    mine = parallel_rows(workers) if workers > 1 else rows()
    wall = time.monotonic() - _started
    earlier_wall, earlier = read_earlier() if append else (0.0, [])
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"wall_seconds": round(earlier_wall + wall, 1), "rows": merged(earlier, mine)},
                              indent=2))


_once: dict[str, tuple[str, object]] = {}


def built_once(name: str, build: Callable[[], T], log_hint: str) -> T:
    """*build*() the first time a session asks for image *name* (its time recorded as a phase); later calls get the
    same image, or — when the first build failed — one line naming that failure and its log, instead of the same
    failure again."""
    if name in _once:
        outcome, value = _once[name]
        if outcome == "failed":
            pytest.fail(f"the {name} image is not built: its build failed earlier in this session ({value}); "
                        f"log: {log_hint}", pytrace=False)
        return value  # type: ignore[return-value]
    start = time.monotonic()
    try:
        value = build()
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        _once[name] = ("failed", f"in {(_current or ['?'])[0]}: {first}")
        record_build(f"{name} (FAILED)", time.monotonic() - start)
        pytest.fail(f"building the {name} image failed: {exc} (log: {log_hint})", pytrace=False)
    record_build(name, time.monotonic() - start)
    _once[name] = ("built", value)
    return value
