"""Read-only facts about a host, read through its connector (local or SSH): machine, Docker and Compose, GPUs,
free disk, clock, file owners, listening ports, images. Nothing here changes a host."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from grpo_deploy.hosts.connect import Host


def machine(host: Host) -> str | None:
    r = host.run(["uname", "-m"])
    return r.out.strip() if r.ok else None


def docker_version(host: Host) -> tuple[str | None, str]:
    """(server version, or None with what the engine said)."""
    r = host.run(["docker", "version", "--format", "{{.Server.Version}}"], timeout=30)
    return (r.out.strip(), "") if r.ok and r.out.strip() else (None, r.line())


def compose_version(host: Host) -> str | None:
    r = host.run(["docker", "compose", "version", "--short"], timeout=30)
    return r.out.strip() if r.ok else None


def docker_root(host: Host) -> str | None:
    r = host.run(["docker", "info", "--format", "{{.DockerRootDir}}"], timeout=30)
    return r.out.strip() if r.ok else None


def volume_mountpoint(host: Host, name: str) -> str | None:
    r = host.run(["docker", "volume", "inspect", "--format", "{{.Mountpoint}}", name], timeout=30)
    return r.out.strip() if r.ok else None


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str
    memory_mib: int | None  # GB10 reports no memory figure ("[N/A]")


def gpus(host: Host) -> list[Gpu] | None:
    """The host's NVIDIA GPUs, or None when nvidia-smi is absent or fails."""
    r = host.run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"])
    if not r.ok:
        return None
    out = []
    for line in r.out.strip().splitlines():
        name, cap, mem = ([p.strip() for p in line.split(",")] + ["", ""])[:3]
        out.append(Gpu(name, cap, int(mem) if mem.isdigit() else None))
    return out


@dataclass(frozen=True)
class Driver:
    gpu: str
    version: str  # e.g. "580.95.05"

    @property
    def major(self) -> int | None:
        head = self.version.split(".", 1)[0]
        return int(head) if head.isdigit() else None


def nvidia_driver(host: Host) -> list[Driver] | None:
    """Each GPU's name and the NVIDIA driver version (nvidia-smi), or None when nvidia-smi is absent or fails."""
    r = host.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout=30)
    return parse_driver_csv(r.out) if r.ok else None


def parse_driver_csv(text: str) -> list[Driver]:
    out = []
    for line in text.strip().splitlines():
        name, _, version = line.rpartition(",")
        if name.strip() and version.strip():
            out.append(Driver(name.strip(), version.strip()))
    return out


@dataclass(frozen=True)
class Free:
    path: str  # the existing directory measured (the nearest existing ancestor of the target)
    free_bytes: int


def free_space(host: Host, target: str) -> Free | None:
    """Free bytes of the filesystem that holds *target* (or would, once created)."""
    candidates = [str(p) for p in [PurePosixPath(target), *PurePosixPath(target).parents]]
    r = host.run(["df", "-P", "-B1", *candidates])
    rows = [row for row in (line.split() for line in r.out.strip().splitlines()[1:]) if len(row) >= 6
            and row[3].isdigit()]
    if not rows:
        return None
    # df prints a row for each candidate that exists, in order; a folder's parents exist when it does, so the rows
    # are the last len(rows) candidates and the first row is the nearest existing one.
    return Free(candidates[len(candidates) - len(rows)], int(rows[0][3]))


def clock_offset(host: Host) -> float | None:
    """Seconds the host's clock is ahead of this machine's (the round trip halved out)."""
    start = time.time()
    r = host.run(["date", "+%s.%N"])
    end = time.time()
    try:
        return float(r.out.strip()) - (start + end) / 2
    except ValueError:
        return None


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    mode: str
    kind: str


def owner(host: Host, path: str) -> Owner | None:
    r = host.run(["stat", "-c", "%u %g %a %F", path])
    if not r.ok:
        return None
    uid, gid, mode, *kind = r.out.split()
    return Owner(int(uid), int(gid), mode, " ".join(kind))


def listening(host: Host, port: int) -> bool | None:
    """Whether something listens on TCP *port* (None when it cannot be told)."""
    r = host.run(["ss", "-H", "-ltn", f"sport = :{port}"])
    if not r.ok:
        return None
    return bool(r.out.strip())


def ipv4_addresses(host: Host) -> dict[str, list[str]] | None:
    """{interface: [its IPv4 addresses]} (`ip -o -4 addr show`), None when it cannot be read."""
    r = host.run(["ip", "-o", "-4", "addr", "show"])
    if not r.ok:
        return None
    out: dict[str, list[str]] = {}
    for line in r.out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet":
            out.setdefault(parts[1].split("@")[0], []).append(parts[3].split("/")[0])
    return out


def listening_ports(host: Host) -> set[int] | None:
    """TCP ports something listens on (`ss -H -ltn`), None when it cannot be told."""
    r = host.run(["ss", "-H", "-ltn"])
    if not r.ok:
        return None
    ports = set()
    for line in r.out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[3].rpartition(":")[2].isdigit():
            ports.add(int(parts[3].rpartition(":")[2]))
    return ports


def exists(host: Host, path: str) -> bool:
    return host.run(["test", "-e", path]).ok


def ssh_server_ip(host: Host) -> str | None:
    """The host's own address of the SSH connection this machine holds to it (its SSH_CONNECTION), None on this
    machine or when unknown."""
    if host.is_local:
        return None
    r = host.run(["sh", "-c", 'echo "$SSH_CONNECTION"'])
    parts = r.out.split() if r.ok else []
    return parts[2] if len(parts) == 4 else None


def resolve_ipv4(host: Host, name: str) -> str | None:
    """The first IPv4 address *name* resolves to on the host (`getent ahostsv4`), None when it does not."""
    r = host.run(["getent", "ahostsv4", name])
    return r.out.split()[0] if r.ok and r.out.split() else None


def image(host: Host, tag: str) -> dict[str, Any] | None:
    """{id, labels, layers (diff ids, base first), arch} of an image on the host's engine, or None."""
    r = host.run(["docker", "image", "inspect", "--format",
                  "{{json .Id}}\t{{json .Config.Labels}}\t{{json .RootFS.Layers}}\t{{json .Architecture}}", tag],
                 timeout=60)
    if not r.ok:
        return None
    image_id, labels, layers, arch = (json.loads(p) for p in r.out.strip().split("\t"))  # JSON never holds a tab
    return {"id": image_id, "labels": labels or {}, "layers": layers or [], "arch": arch}


def layer_chains(host: Host) -> list[list[str]]:
    """The layer lists (diff ids, base first) of every image on the host's engine."""
    ids = host.run(["docker", "image", "ls", "-q", "--no-trunc"], timeout=60)
    if not ids.ok or not ids.out.split():
        return []
    r = host.run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", *sorted(set(ids.out.split()))],
                 timeout=120)
    return [json.loads(line) or [] for line in r.out.splitlines() if line.strip()]
