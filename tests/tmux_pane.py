"""Test helper: a tmux server on a private socket (no user config) that runs a command in a fresh pane of a given
width and returns what the pane shows (tests/static/test_terminal.py; scripts/replay_up.py --tmux)."""

from __future__ import annotations

import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TMUX = "/usr/bin/tmux"
# What the pane's command must not inherit from this process: a width (argparse and the kit would read it instead of
# the terminal's), a colour switch.
CLEAN = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "PYTHON_COLORS", "CLICOLOR_FORCE")


class TmuxMissing(RuntimeError):
    """tmux is not installed where this helper expects it."""


@dataclass
class Pane:
    rows: list[str]  # the terminal's rows, as shown
    joined: list[str]  # the same with rows the terminal wrapped joined back (capture-pane -J)
    escaped: str  # the rows with their attributes as escape sequences (capture-pane -e)


class Tmux:
    """A tmux server on a private socket: a command run in a fresh pane of a given size, then the pane captured."""

    def __init__(self):
        if not Path(TMUX).is_file():
            raise TmuxMissing(f"{TMUX} is missing: a real terminal is needed here (Debian: apt-get install tmux)")
        self.socket = f"grpo-term-{os.getpid()}-{secrets.token_hex(4)}"
        self.n = 0
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "keep", ";",
                  "set-option", "-g", "history-limit", "100000")

    def tmux(self, *args: str, timeout: float = 30) -> str:
        return subprocess.run([TMUX, "-L", self.socket, *args], capture_output=True, text=True, check=True,
                              timeout=timeout).stdout

    def run(self, argv: list[str], columns: int, env: dict[str, str] | None = None, wait_s: float = 120) -> Pane:
        """*argv* run in a new pane *columns* wide (from the repository root, with *env* added), to its end (at most
        *wait_s* seconds)."""
        self.n += 1
        name, done = f"s{self.n}", f"done-{self.socket}-{self.n}"
        setting = [f"{k}={v}" for k, v in {"PYTHONPATH": str(ROOT), "TERM": "xterm-256color", **(env or {})}.items()]
        unset = [a for k in CLEAN if k not in (env or {}) for a in ("-u", k)]
        command = subprocess.list2cmdline(["env", *unset, *setting, *argv])
        self.tmux("new-session", "-d", "-s", name, "-x", str(columns), "-y", "50", "-c", str(ROOT),
                  f"{command}; {TMUX} -L {self.socket} wait-for -S {done}; exec sleep 600")
        self.tmux("wait-for", done, timeout=wait_s)
        grab = ["capture-pane", "-p", "-S", "-", "-E", "-", "-t", name]
        pane = Pane(_rows(self.tmux(*grab)), _rows(self.tmux(*grab, "-J")), self.tmux(*grab, "-e"))
        self.tmux("kill-session", "-t", name)
        return pane

    def close(self) -> None:
        subprocess.run([TMUX, "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def _rows(text: str) -> list[str]:
    rows = [r.rstrip() for r in text.split("\n")]
    while rows and not rows[-1]:
        rows.pop()
    return rows
