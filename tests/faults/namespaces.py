"""Fault-suite helper: change what ONE container sees of the shared volume, mid-run, without touching the volume —
a mount made as root inside that container's mount namespace (nsenter from this host; Docker refuses privileged
helper containers here). The mount lives and dies with the container; the other role keeps the real view."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def require_nsenter() -> None:
    """The injections need root on the Docker host and nsenter (util-linux); CI runs as root beside its dockerd."""
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        pytest.skip("these faults are injected with nsenter as root on the Docker host (not root, or no nsenter)")


def in_mount_namespace(container, script: str) -> None:
    """Run *script* (sh, as root) inside *container*'s mount namespace; the binaries are the container's own."""
    container.reload()
    pid = container.attrs["State"]["Pid"]
    proc = subprocess.run(["nsenter", "-t", str(pid), "-m", "--", "sh", "-ec", script], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, f"injection failed in {container.name}: {proc.stdout}{proc.stderr}"


def hide_behind_root_dir(container, path: str) -> None:
    """*path* becomes, for *container* only, an empty root-owned 0700 directory (a tmpfs over it)."""
    in_mount_namespace(container, f"mount -t tmpfs -o size=1m,mode=0700,uid=0,gid=0 grpo-fault '{path}'")


def make_read_only(container, path: str) -> None:
    """*path* becomes, for *container* only, a read-only view of itself (a bind mount remounted ro): every write
    below it fails with EROFS, every file stays readable."""
    in_mount_namespace(container, f"mount --bind '{path}' '{path}' && mount -o remount,bind,ro '{path}'")
