"""The harness's GPU memory watch: each role's peak GPU memory (every process of its session), sampled once a second
from nvidia-smi's compute apps and /proc; nothing without nvidia-smi."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any


def _session_of(pid: int) -> int | None:
    """The session id of *pid* (field 6 of /proc/PID/stat), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[3])


def gpu_use_by_pid(smi: str | None) -> dict[int, int]:
    """pid -> MiB of GPU memory, from nvidia-smi (every process that holds a CUDA context); {} without one."""
    if not smi:
        return {}
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_compute_apps(out)


def parse_compute_apps(text: str) -> dict[int, int]:
    use: dict[int, int] = {}
    for line in text.splitlines()[:256]:
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            use[int(pid)] = use.get(int(pid), 0) + int(mib)
    return use


class MemoryWatch(threading.Thread):
    """Samples each role's GPU memory (every process of its session) once a second and keeps the peak (*roles*: the
    harness's Role, read for process.pid, written at peak_mib)."""

    def __init__(self, roles: list[Any]):
        super().__init__(daemon=True)
        self.roles, self.smi, self.done = roles, shutil.which("nvidia-smi"), threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            use = gpu_use_by_pid(self.smi)
            for role in self.roles:
                mine = sum(mib for pid, mib in use.items() if _session_of(pid) == role.process.pid)
                role.peak_mib = max(role.peak_mib, mine)
