"""An exclusive lock on a directory, held by one writer of the kit at a time (a render into a folder, a prune or
resume of a checkpoint folder): flock on the directory's own descriptor, so nothing is created to take it and the
lock goes with the process. Where the filesystem has no flock for a directory opened read-only (NFS emulates flock
with byte-range locks, which need a file open for writing), a lock file made with O_EXCL stands in for it. A second
writer waits up to its deadline, then is refused with one line.

Pure standard library: runs inside the images too (the checkpoint manager)."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

WAIT_S = 30.0
LOCK_FILE = ".grpo-deploy.lock"


class Busy(RuntimeError):
    """Another process of the kit holds the lock past the deadline; nothing was done."""


def _busy(directory: str | os.PathLike, what: str, wait_s: float, extra: str = "") -> Busy:
    return Busy(f"{os.fspath(directory)}: another grpo-deploy process is writing {what} (it held the lock for "
                f"{wait_s:.0f} s); wait for it to finish, then run this again{extra}")


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
                    raise _busy(directory, what, wait_s) from None
                time.sleep(0.05)
            except OSError as exc:
                if exc.errno not in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                with _lock_file(directory, what, deadline, wait_s):
                    yield
                return
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextmanager
def _lock_file(directory: str | os.PathLike, what: str, deadline: float, wait_s: float) -> Iterator[None]:
    """The stand-in: LOCK_FILE created with O_EXCL (atomic on NFS too), removed at the end."""
    path = os.path.join(directory, LOCK_FILE)
    while True:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644))
            break
        except FileExistsError:
            if time.monotonic() >= deadline:
                raise _busy(directory, what, wait_s, f" (or remove {path} if no grpo-deploy process runs)") from None
            time.sleep(0.05)
    try:
        yield
    finally:
        os.unlink(path)
