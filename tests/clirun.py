"""Test helper: `grpo-deploy ARGS` run from a folder in a subprocess of this Python, its output printed (pytest shows
it when a test fails), bounded by a timeout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    print(f"$ grpo-deploy {' '.join(args)}  -> exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    return proc
