"""Whether the next checkpoint fits on the disk that holds it: the watchdog's settings (`DiskWatchdogConfig`), the
free space, and the verdict against the next checkpoint plus the margin. The trainer's watchdog (a TRL callback) and
the verl node judge with it; it imports neither."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import Field

from grpo_deploy.common.strict import Strict
from grpo_deploy.runtime.storage.checkpoints import list_checkpoints


class DiskWatchdogConfig(Strict):
    """Before each save: stop the run cleanly when free space where checkpoints go is under the next checkpoint
    (the larger of this estimate and the newest checkpoint's real size) plus the margin."""

    checkpoint_bytes: int = Field(0, ge=0)
    """The plan's estimate of one checkpoint (0 = measure the newest one only)."""
    margin_bytes: int = Field(0, ge=0)
    """Left free after the save (checkpoints.disk_margin_gb)."""


@dataclass(frozen=True)
class Verdict:
    fits: bool
    free_bytes: int
    need_bytes: int
    message: str


def free_bytes(path: str) -> int:
    """Free bytes for this (unprivileged) process on the filesystem holding *path* (its nearest existing parent)."""
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def judge(output_dir: str, config: DiskWatchdogConfig, free: Callable[[str], int] = free_bytes,
          layout: str = "trl") -> Verdict:
    """Whether the next save fits: free space against max(estimate, newest complete checkpoint's size) + margin."""
    complete = [c for c in list_checkpoints(output_dir, layout) if c.complete]
    newest = complete[-1].size_bytes if complete else 0
    need = max(config.checkpoint_bytes, newest) + config.margin_bytes
    have = free(output_dir)
    if have >= need:
        return Verdict(True, have, need, "")
    kept = f"the newest complete checkpoint ({complete[-1].path}) is kept" if complete else "no checkpoint yet"
    return Verdict(False, have, need, f"disk watchdog: {have / 1e9:.2f} GB free at {output_dir}, the next save needs "
                   f"{need / 1e9:.2f} GB (checkpoint {max(config.checkpoint_bytes, newest) / 1e9:.2f} GB + margin "
                   f"{config.margin_bytes / 1e9:.2f} GB): stopped before saving; {kept}. Free "
                   f"{(need - have) / 1e9:.2f} GB (or lower checkpoints.keep) and resume with `grpo-deploy up`")
