"""The check registry and runner: verdicts, Result, `@check` with what each check needs, run_checks, table and JSON.

A check is a small function `(Context) -> list[Result]`. Checks never change a host: the one that needs to write
(the shared-volume permission probe) writes only a probe file under the run's own directory and removes it. Exit
codes: 0 every check passed (warnings allowed), 1 a check failed, 2 preflight could not run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_deploy.common.table import table
from grpo_deploy.preflight.session import Context

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2
# The order checks run and are shown in, across their modules: reachable reads every remote fact at once (in
# parallel), which the later checks reuse; memory needs the plan's split, disk the plan, images and driver the images
# each host runs.
ORDER = ("spec", "memory", "identity", "reachable", "clock", "docker", "arch", "port", "cluster", "disk", "logger",
         "images", "driver", "shared-volume", "cluster-reach")


@dataclass
class Result:
    check: str
    host: str
    verdict: str
    fact: str
    hint: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """A registered check and what it needs. needs_images: it can only run once the run's images are on their
    hosts (`up` runs it after shipping them); reads_images: its verdict reads which images the hosts have, so `up`
    runs it again after shipping."""

    name: str
    description: str
    fn: Callable[[Context], list[Result]]
    needs_images: bool = False
    reads_images: bool = False

    @property
    def after_shipping(self) -> bool:
        return self.needs_images or self.reads_images


CHECKS: list[Check] = []


def check(name: str, description: str, *, needs_images: bool = False, reads_images: bool = False):
    """Register a check under *name* (its place in ORDER sets when it runs)."""
    def register(fn: Callable[[Context], list[Result]]) -> Callable[[Context], list[Result]]:
        expected = f"check_{name.replace('-', '_')}"
        if fn.__name__ != expected:  # the decorator landed on a helper defined between it and its check
            raise TypeError(f"@check({name!r}) decorates {fn.__name__}; it belongs on {expected}")
        CHECKS.append(Check(name, description, fn, needs_images, reads_images))
        CHECKS.sort(key=lambda c: ORDER.index(c.name))  # a name missing from ORDER fails at import, by design
        return fn

    return register


def names() -> list[str]:
    return [c.name for c in CHECKS]


def before_shipping() -> list[str]:
    """The checks `up` runs before any image is shipped: every one that can run without the images on the hosts."""
    return [c.name for c in CHECKS if not c.needs_images]


def after_shipping() -> list[str]:
    """The checks `up` runs once the images are on the hosts: those that need them or read which are there."""
    return [c.name for c in CHECKS if c.after_shipping]


def run_checks(ctx: Context, only: list[str] | None = None) -> list[Result]:
    results: list[Result] = []
    for c in CHECKS:
        if only and c.name not in only:
            continue
        try:
            results.extend(c.fn(ctx))
        except Exception as exc:  # a check that cannot run is reported, never a traceback
            results.append(Result(c.name, "-", FAIL, f"check could not run: {type(exc).__name__}: {exc}"))
    return results


def table_text(results: list[Result]) -> str:
    return table(["check", "host", "verdict", "fact / fix"],
                 [[r.check, r.host, r.verdict.upper(), r.fact + (f"  -> fix: {r.hint}" if r.hint else "")]
                  for r in results])


def exit_code(results: list[Result]) -> int:
    return EXIT_FAILED if any(r.verdict == FAIL for r in results) else EXIT_OK


def to_json(results: list[Result]) -> str:
    code = exit_code(results)
    return json.dumps({"ok": code == EXIT_OK, "exit_code": code,
                       "checks": [asdict(r) for r in results]}, indent=2, default=str)
