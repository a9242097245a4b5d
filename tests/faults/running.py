"""Fault-suite helper: one `grpo-deploy up` in the background, its output read line by line so that a test can
inject its fault at a given optimizer step, with a watchdog that kills it after a bound."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Callable

UP_TIMEOUT_S = 1800
STEP = re.compile(r"step (\d+)/(\d+)")


def up_with_fault(run: dict, at_step: int, inject: Callable[[int], None], *extra: str) -> tuple[int, str]:
    """`up --fresh --keep` of the fault run; *inject*(step) is called once, when the progress line of *at_step* (or a
    later one) is printed. Returns (exit code, everything `up` printed)."""
    proc = subprocess.Popen([sys.executable, "-m", "grpo_deploy.cli", "up", "-f", str(run["spec"]), "--fresh",
                             "--keep", *extra], cwd=run["cwd"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    watchdog = threading.Timer(UP_TIMEOUT_S, proc.kill)
    watchdog.start()
    lines, injected = [], False
    try:
        for line in proc.stdout:
            lines.append(line)
            m = STEP.search(line)
            if m and not injected and int(m.group(1)) >= at_step:
                injected = True
                inject(int(m.group(1)))
        code = proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        proc.kill()
    output = "".join(lines)
    assert injected, f"the run never reached step {at_step}, so the fault was not injected:\n{output[-3000:]}"
    return code, output


def cli(run: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_deploy.cli", *args, "-f", str(run["spec"])], cwd=run["cwd"],
                          capture_output=True, text=True, timeout=timeout)
