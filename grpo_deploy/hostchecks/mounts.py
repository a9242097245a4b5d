"""NFS mount facts (pure): what `findmnt` shows for a mount against what storage.nfs asks for. The kernel shows some
options under another name or value (nfsvers=4.1 as vers=4.1, lookupcache=positive as lookupcache=pos), never shows
some (_netdev, x-systemd.*, bg), and lowers some to what the server allows (rsize, wsize): compared accordingly."""

from __future__ import annotations

import json
from typing import Any

NAMES = {"nfsvers": "vers"}
VALUES = {("lookupcache", "positive"): "pos", ("lookupcache", "none"): "none"}
NEVER_SHOWN = {"_netdev", "auto", "noauto", "bg", "fg", "defaults", "nofail", "user", "nouser", "users", "intr",
               "nointr", "retry", "lookupcache=all"}
AT_MOST = {"rsize", "wsize"}  # the server may lower them


def _options(text: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if key:
            out[key] = value if sep else None
    return out


def option_gaps(wanted: str, shown: str) -> list[str]:
    """The wanted options (storage.nfs.options) that the mount's options (findmnt OPTIONS) do not carry."""
    have = _options(shown)
    gaps = []
    for key, value in _options(wanted).items():
        written = key if value is None else f"{key}={value}"  # as storage.nfs.options has it
        name = NAMES.get(key, key)
        value = VALUES.get((name, value), value)
        if name in NEVER_SHOWN or f"{name}={value}" in NEVER_SHOWN or name.startswith("x-"):
            continue
        if name not in have:
            gaps.append(f"{written} (not set)")
        elif value is None:
            continue
        elif name == "vers":
            if not (have[name] == value or (have[name] or "").startswith(f"{value}.")):
                gaps.append(f"{written} (mounted with vers={have[name]})")
        elif name in AT_MOST and value.isdigit() and (have[name] or "").isdigit():
            if int(have[name]) > int(value):
                gaps.append(f"{written} (mounted with {name}={have[name]})")
        elif have[name] != value:
            gaps.append(f"{written} (mounted with {name}={have[name]})")
    return gaps


def parse_findmnt(text: str) -> dict[str, Any] | None:
    """The first filesystem of `findmnt --json -o TARGET,SOURCE,FSTYPE,OPTIONS` output, or None."""
    try:
        found = json.loads(text).get("filesystems") or []
    except (json.JSONDecodeError, AttributeError):
        return None
    return found[0] if found else None


def same_export(source: str, server: str, export: str, server_ips: set[str] = frozenset()) -> bool:
    """Whether a mount source `host:/path` is storage.nfs's server and export (the server by name or by address)."""
    host, sep, path = source.rpartition(":")
    if not sep:
        return False
    host = host.strip("[]")
    return path.rstrip("/") == export.rstrip("/") and (host == server or host in server_ips)
