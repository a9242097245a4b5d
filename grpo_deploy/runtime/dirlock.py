"""An exclusive lock on a directory, held by one writer of the kit at a time (a render into a folder, a prune or
resume of a checkpoint folder): flock on the directory's own descriptor, so nothing is created to take it and the
lock goes with the process. A second writer waits up to its deadline, then is refused with one line.

Pure standard library: runs inside the images too (the checkpoint manager)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

WAIT_S = 30.0


class Busy(RuntimeError):
    """Another process of the kit holds the lock past the deadline; nothing was done."""


@contextmanager
def locked(directory: str | os.PathLike, what: str, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold the exclusive lock of *directory* (which must exist) for the block; wait up to *wait_s*, then Busy."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Busy(f"{os.fspath(directory)}: another grpo-deploy process is writing {what} (it held the "
                               f"lock for {wait_s:.0f} s); wait for it to finish, then run this again") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
