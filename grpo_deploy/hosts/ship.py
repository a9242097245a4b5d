"""Images to hosts without a registry: `docker save` on this machine streamed into `docker load` on a host over its
connector, sending only what the host lacks. A host that has the image's ID gets nothing; one that has the image's
base layers (e.g. the cpu dependency image, shipped once) gets only the layers above them, so a code-only change
sends megabytes, not gigabytes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from grpo_deploy.hosts import facts
from grpo_deploy.hosts.connect import CHUNK, Host, HostError, LocalHost, chunks_of


@dataclass(frozen=True)
class Shipped:
    host: str
    tag: str
    status: str  # "present" (same image ID there), "shipped"
    bytes_sent: int = 0
    seconds: float = 0.0
    layers_sent: int = 0
    layers_skipped: int = 0


def shared_prefix(layers: list[str], chains: list[list[str]]) -> int:
    """How many of *layers* (base first) the host already has as a chain: the longest common prefix with any of
    its images' layer lists (a layer is only reusable with the same layers below it)."""
    best = 0
    for chain in chains:
        n = 0
        for mine, theirs in zip(layers, chain, strict=False):
            if mine != theirs:
                break
            n += 1
        best = max(best, n)
    return best


def ship(tag: str, target: Host, progress: Callable[[str], None] | None = None,
         source: Host | None = None) -> Shipped:
    """Make *tag* exist on *target* with the same image ID as on this machine, sending only what is missing."""
    source = source or LocalHost()
    mine = facts.image(source, tag)
    if mine is None:
        raise HostError(source.name, f"image {tag} is not on this machine's engine", "build or load it first")
    theirs = facts.image(target, tag)
    if theirs is not None and theirs["id"] == mine["id"]:
        return Shipped(target.name, tag, "present")
    prefix = shared_prefix(mine["layers"], facts.layer_chains(target))
    skip: set[str] | None = set()
    if prefix == len(mine["layers"]):  # every layer is there (e.g. only labels changed): send config and manifest
        skip = None
    elif prefix:  # a partial match needs to know which archive is which layer
        if progress and not layer_map_cached(mine["id"]):
            progress(f"reading the layers of {tag} once (so {target.name} gets only the {len(mine['layers']) - prefix}"
                     f" it lacks)")
        with _map_lock(mine["id"]):
            members = layer_members(tag, mine["id"])
        present = set(mine["layers"][:prefix])
        skip = {member for member, diff_id in members.items() if diff_id in present}
    start = time.time()
    sent = [0]

    def report(total: int) -> None:
        sent[0] = total
        if progress:
            rate = total / max(time.time() - start, 1e-3) / 1e6
            progress(f"shipping {tag} to {target.name}: {total / 1e6:,.0f} MB ({rate:,.0f} MB/s)")

    archive = _archive(mine["id"]) if prefix and _archive(mine["id"]).is_file() else None
    result = target.stream(["docker", "load", "-q"], _filtered_save(tag, skip, report, archive))
    if not result.ok and skip:
        # A host whose engine wants every layer in the archive after all: send the whole image once.
        skip = set()
        result = target.stream(["docker", "load", "-q"], _filtered_save(tag, skip, report))
    if not result.ok:
        raise HostError(target.name, f"docker load of {tag} failed: {result.line()}",
                        "check free space in the host's Docker root and that its engine runs")
    loaded = facts.image(target, tag)
    if loaded is None or loaded["id"] != mine["id"]:
        raise HostError(target.name, f"after docker load, {tag} there is {loaded and loaded['id'][:19]}, "
                        f"not {mine['id'][:19]}", "remove the host's image and run again")
    skipped = len(mine["layers"]) if skip is None else len(skip)
    return Shipped(target.name, tag, "shipped", sent[0], round(time.time() - start, 1),
                   len(mine["layers"]) - skipped, skipped)


_MAP_LOCKS: dict[str, threading.Lock] = {}
_MAP_LOCKS_GUARD = threading.Lock()


def _map_lock(image_id: str) -> threading.Lock:
    """One reader of an image's layers at a time (hosts are shipped to in parallel)."""
    with _MAP_LOCKS_GUARD:
        return _MAP_LOCKS.setdefault(image_id, threading.Lock())


def _layer_cache(image_id: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo-deploy" / "layers"
    return cache / f"{image_id.replace(':', '-')}.json"


def _archive(image_id: str) -> Path:
    """The image's `docker save` archive kept beside its layer map: each host lacking some layers is sent them from
    it by seeking past the rest, instead of another full `docker save` read through per host."""
    return _layer_cache(image_id).with_suffix(".tar")


ARCHIVES_KEPT = 2
"""Saved archives kept (the newest; each is the whole image, a few GB)."""


def layer_map_cached(image_id: str) -> bool:
    return _layer_cache(image_id).is_file() and _archive(image_id).is_file()


class _Tee:
    """A read-only stream that writes what is read from it into *sink* too."""

    def __init__(self, source, sink):
        self.source, self.sink = source, sink

    def read(self, n: int = -1) -> bytes:
        data = self.source.read(n)
        self.sink.write(data)
        return data


def layer_members(tag: str, image_id: str) -> dict[str, str]:
    """{`<dir>/layer.tar` member of `docker save tag`: its diff id}. docker save orders members by name, not by
    layer, so the mapping comes from one read of the archive hashing each layer (a layer's diff id is the sha256
    of its uncompressed tar), kept in ~/.cache/grpo-deploy/layers/ by image id with the archive itself."""
    path, archive = _layer_cache(image_id), _archive(image_id)
    if path.is_file() and archive.is_file():
        return json.loads(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".tar.tmp")
    save = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    members: dict[str, str] = {}
    with open(partial, "wb") as kept, tarfile.open(fileobj=_Tee(save.stdout, kept), mode="r|") as src:
        for member in src:
            if member.name.endswith("/layer.tar") and member.isfile():
                digest = hashlib.sha256()
                handle = src.extractfile(member)
                while chunk := handle.read(CHUNK):
                    digest.update(chunk)
                members[member.name] = f"sha256:{digest.hexdigest()}"
        while _Tee(save.stdout, kept).read(CHUNK):  # the archive's end blocks, as docker load reads them
            pass
    if save.wait() != 0:
        partial.unlink(missing_ok=True)
        raise HostError("local", f"docker save {tag} failed", "check the local engine")
    partial.replace(archive)
    for old in sorted(path.parent.glob("*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)[ARCHIVES_KEPT:]:
        old.unlink(missing_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(members))
    tmp.replace(path)
    return members


def _filtered_save(tag: str, skip: set[str] | None, progress: Callable[[int], None],
                   archive: Path | None = None) -> Iterator[bytes]:
    """`docker save tag` (or its kept *archive*, where layers not sent are seeked past, not read) as a byte stream
    without the layer archives named in *skip* (None: without any) -- docker load does not read a layer the engine
    already has with the same layers below it."""
    read_fd, write_fd = os.pipe()
    save = None if archive is not None else \
        subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    errors: list[BaseException] = []

    def filter_tar() -> None:
        try:
            src_tar = tarfile.open(archive, mode="r:") if save is None else \
                tarfile.open(fileobj=save.stdout, mode="r|")
            with os.fdopen(write_fd, "wb") as out, src_tar as src, \
                    tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as dst:
                for member in src:
                    if member.name.endswith("/layer.tar") and (skip is None or member.name in skip):
                        continue
                    data = src.extractfile(member) if member.isfile() else None
                    dst.addfile(member, data)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            errors.append(exc)

    worker = threading.Thread(target=filter_tar, name=f"save-{tag}", daemon=True)
    worker.start()
    with os.fdopen(read_fd, "rb") as stream:
        yield from chunks_of(stream, progress=progress)  # the running total each second, and at the end
    worker.join()
    failed = save is not None and save.wait() != 0
    if errors or failed:
        detail = (save.stderr.read().decode(errors="replace").strip() if save is not None else "") or \
            repr(errors[:1])
        raise HostError("local", f"docker save {tag} failed: {detail[:300]}", "check the local engine")
