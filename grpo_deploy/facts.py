"""Read-only facts about the local host: free disk, Docker engine, images, credentials. Nothing here changes state."""

from __future__ import annotations

import netrc
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DiskFree:
    path: str  # the existing directory that was measured (nearest existing ancestor of the target)
    free_bytes: int
    total_bytes: int


def disk_free(target: str) -> DiskFree:
    """Free space of the filesystem that holds *target* (or would, once created)."""
    path = Path(target)
    while not path.exists() and path != path.parent:
        path = path.parent
    usage = shutil.disk_usage(path)
    return DiskFree(str(path), usage.free, usage.total)


def tree_bytes(root: str, skip: tuple[str, ...] = ()) -> int:
    """Bytes the files under *root* occupy on disk (allocated blocks, as `du`), the top-level names in *skip* left
    out; 0 when *root* does not exist or cannot be read."""
    total = 0
    for current, dirs, files in os.walk(root):
        if current == root:
            dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            try:
                total += os.lstat(os.path.join(current, name)).st_blocks * 512
            except OSError:
                pass
    return total


def docker_info(client) -> dict[str, Any]:
    info = client.info()
    return {"server_version": info.get("ServerVersion"), "root_dir": info.get("DockerRootDir"),
            "architecture": info.get("Architecture"), "runtimes": sorted((info.get("Runtimes") or {}).keys()),
            "cpus": info.get("NCPU"), "memory_bytes": info.get("MemTotal")}


def image_labels(client, tag: str) -> dict[str, str] | None:
    """Labels of a local image, or None when the image is not present."""
    import docker

    try:
        return dict(client.images.get(tag).labels or {})
    except docker.errors.ImageNotFound:
        return None


def volume_mountpoint(client, name: str) -> str | None:
    import docker

    try:
        return client.volumes.get(name).attrs.get("Mountpoint")
    except docker.errors.NotFound:
        return None


def env_set(name: str, environ: dict[str, str] | None = None) -> bool:
    return bool((environ if environ is not None else os.environ).get(name))


def netrc_has(machine: str, path: str | None = None) -> bool:
    path = path or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(machine) is not None
    except (FileNotFoundError, netrc.NetrcParseError, PermissionError):
        return False
