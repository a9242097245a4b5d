"""Helpers of the tests that need root (CI runs as root): a small real filesystem, and a call made as another uid."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """tmp_path/small, a tmpfs of *size* (mount's size=, e.g. "4m"), unmounted after; the test is skipped unless
    it runs as root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def as_uid(uid: int, call: Callable[[], Any]) -> Any:
    """call()'s answer (JSON-able) from a forked child that has dropped its groups and switched to uid and gid *uid*,
    like a process of another user; the child leaves without running pytest's cleanup. No new process is started:
    the interpreter under /root is not executable by another user."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(write, json.dumps(call()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    os.waitpid(pid, 0)
    return json.loads(text)
