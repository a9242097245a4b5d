"""Read-only facts of this machine that are not read through a host connector: an image's labels on this machine's
engine (the images `up` ships from here), the logger's credentials. Nothing here changes state."""

from __future__ import annotations

import netrc
import os


def image_labels(client, tag: str) -> dict[str, str] | None:
    """Labels of a local image, or None when the image is not present."""
    import docker

    try:
        return dict(client.images.get(tag).labels or {})
    except docker.errors.ImageNotFound:
        return None


def env_set(name: str, environ: dict[str, str] | None = None) -> bool:
    return bool((environ if environ is not None else os.environ).get(name))


def netrc_has(machine: str, path: str | None = None) -> bool:
    path = path or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(machine) is not None
    except (FileNotFoundError, netrc.NetrcParseError, PermissionError):
        return False
