"""Quiet progress for long build steps: one line per step (a bar where a size is known), the step's full output in a
log file whose path is printed, and on failure the last lines of that log."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from grpo_deploy.common.term import columns, cut, escapes_ok, fit

TAIL_LINES = 20
BAR_WIDTH = 24


class StepFailed(RuntimeError):
    """A build step failed; its message is one line, and the log tail has been printed."""


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def bar(done: float, total: float) -> str:
    """`[#####-----]  42%` for done of total."""
    frac = 0.0 if total <= 0 else max(0.0, min(1.0, done / total))
    full = int(frac * BAR_WIDTH)
    return f"[{'#' * full}{'-' * (BAR_WIDTH - full)}] {frac * 100:3.0f}%"


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


class Step:
    """One long step: `with Step("deps image", log_path) as step: step.update("3/12 steps", done=3, total=12)`.

    On a terminal that takes escapes (term.escapes_ok) the step is one line rewritten in place, cut to the width;
    elsewhere (CI, a pipe, NO_COLOR), or with *lines_only* (a step that runs beside another one's redrawn line), a
    start line and an end line, wrapped under the step's name on a terminal (term.fit). The log file collects the
    step's full output (`step.log` is an open text file; subprocesses can write to it)."""

    def __init__(self, name: str, log_path: Path, out: TextIO | None = None, lines_only: bool = False):
        self.name, self.log_path = name, log_path
        self.out = out or sys.stderr
        self.tty = not lines_only and escapes_ok(self.out)
        self.start = time.monotonic()
        self.detail = ""
        self._last_draw = 0.0
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log: TextIO = log_path.open("a", buffering=1)

    def __enter__(self) -> Step:
        self.log.write(f"=== {self.name}: {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        if self.tty:
            self._draw("starting")
        else:
            self._line(f"started (log: {self.log_path})")
        return self

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def _draw(self, text: str, end: str = "") -> None:
        line = f"{self.name}: {text}"
        width = max(40, (columns(self.out) or 100) - 1)
        print(f"\r\033[K{cut(line, width)}", end=end, file=self.out, flush=True)

    def _line(self, text: str) -> None:
        print(fit(text, self.out, f"{self.name}: "), file=self.out, flush=True)

    def update(self, detail: str, done: float | None = None, total: float | None = None) -> None:
        """Show progress (a bar when done/total are given); redrawn at most 4 times a second."""
        self.detail = f"{bar(done, total)} {detail}" if done is not None and total else detail
        now = time.monotonic()
        if self.tty and now - self._last_draw >= 0.25:
            self._last_draw = now
            self._draw(f"{self.detail}  {self.elapsed():.0f} s")

    def write(self, lines: Iterable[str] | str) -> None:
        """Append output to the log (never to the terminal)."""
        self.log.write(lines if isinstance(lines, str) else "".join(lines))

    def done(self, summary: str) -> None:
        self.summary = summary

    def __exit__(self, exc_type, exc, tb) -> bool:
        took = f"{self.elapsed():.0f} s"
        if exc_type is None:
            text = f"{getattr(self, 'summary', 'done')} ({took})"
            self.log.write(f"=== {self.name}: {text}\n")
            self.log.close()
            if self.tty:
                self._draw(text, end="\n")
            else:
                self._line(text)
            return False
        self.log.write(f"=== {self.name}: failed after {took}: {exc}\n")
        self.log.close()
        if self.tty:
            self._draw(f"FAILED after {took}", end="\n")
        if not isinstance(exc, KeyboardInterrupt):
            print(f"--- last lines of {self.log_path}:", file=self.out)
            for line in tail(self.log_path):
                print(f"    {line}", file=self.out)
            self._line(f"FAILED after {took}: {exc} (full log: {self.log_path})")
        return False
