"""Shared-volume faults as the trainer meets them mid-run — an adapter the server cannot read, a directory that is
gone, read-only or denied — turned into one message naming the path, the identity and the fix (stdlib only; the
only side effect is stat).

Stopping is the answer to both (no retry loop): a share that went read-only, lost its mount or changed owner does
not heal by itself, every retry of an adapter sync holds the server paused, and the newest complete checkpoint makes
the fix-then-resume cheap."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from grpo_deploy.runtime.identity import format_mode

KINDS = {errno.EROFS: "read-only", errno.ENOENT: "missing", errno.EACCES: "permission", errno.EPERM: "permission",
         errno.ESTALE: "missing", errno.ENOTDIR: "missing"}
RESUME = "then run `grpo-deploy up` again: it resumes from the newest complete checkpoint"
# vLLM 0.32 answers 404 "Loading lora X failed: No adapter found for <path>" when it cannot open the adapter
# (safetensors reports EACCES as "No such file"), and 400 with the OSError's text for other read failures.
ADAPTER_NOT_FOUND = r"No adapter found|LoRAAdapterNotFound"  # vLLM: the folder is not (yet) there for the server
SERVER_CANNOT_READ = re.compile(ADAPTER_NOT_FOUND + r"|Permission denied|Errno 13|EACCES|No such file|Errno 2", re.I)


@dataclass(frozen=True)
class PathView:
    """How one path looks to this process: the first component it cannot reach (missing, or a directory it may not
    enter), or, when it reaches the path, whether it may read (and, for a directory, enter) it."""

    path: str
    blocked: str | None  # the first path component that is missing or not enterable; None when reachable
    problem: str | None  # "missing" | "no access" | "not readable" | None
    mode: str | None  # of `blocked` (or of `path` when reachable)
    owner: str | None  # uid:gid of the same

    def words(self) -> str:
        if self.problem is None:
            return f"{self.path} is readable (mode {self.mode}, owner {self.owner})"
        if self.problem == "missing":
            return f"{self.blocked} does not exist"
        return f"{self.blocked} is mode {self.mode}, owner {self.owner} ({self.problem})"


def _stat_words(path: str) -> tuple[str | None, str | None]:
    try:
        st = os.stat(path)
    except OSError:
        return None, None
    return format_mode(st.st_mode), f"{st.st_uid}:{st.st_gid}"


def view(path: str) -> PathView:
    """Walk *path* from `/` down as this process; stop at the first component that is missing or not enterable."""
    path = os.path.abspath(path)
    parts = [p for p in path.split("/") if p]
    current = "/"
    for part in parts:
        parent, current = current, os.path.join(current, part)
        try:
            os.lstat(current)
        except FileNotFoundError:
            return PathView(path, current, "missing", None, None)
        except (PermissionError, NotADirectoryError) as error:
            if isinstance(error, NotADirectoryError):
                return PathView(path, parent, "missing", *_stat_words(parent))
            return PathView(path, parent, "no access", *_stat_words(parent))
    mode, owner = _stat_words(path)
    wanted = os.R_OK | (os.X_OK if os.path.isdir(path) else 0)
    if not os.access(path, wanted):
        return PathView(path, path, "not readable", mode, owner)
    return PathView(path, None, None, mode, owner)


@dataclass(frozen=True)
class Mount:
    point: str
    options: str  # the mount's own options, e.g. "ro,relatime"
    fstype: str
    source: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options.split(",")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: str, mountinfo: str | None = None) -> Mount | None:
    """The mount holding *path* (the longest mount point above it, the last one mounted there winning), from
    /proc/self/mountinfo text; None when it cannot be read."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8") as handle:
                mountinfo = handle.read()
        except OSError:
            return None
    best = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 2:
            continue
        point = _unescape(fields[4])
        if under(path, point) and (best is None or len(point) >= len(best.point)):
            best = Mount(point, fields[5], tail[0], _unescape(tail[1]))
    return best


def nearest_existing(path: str) -> str:
    """*path*, or its nearest ancestor that exists (a failed write names a file that was never made)."""
    path = os.path.abspath(path)
    while not os.path.lexists(path) and path != "/":
        path = os.path.dirname(path)
    return path


def os_errors(exc: BaseException | None) -> Iterator[OSError]:
    """Every OSError in *exc*'s chain (itself, its cause, its context), outermost first, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError):
            yield exc
        exc = exc.__cause__ or exc.__context__


@dataclass(frozen=True)
class Fault:
    """A classified shared-volume fault: what (`kind`), where (`path`), and the message a user reads."""

    kind: str  # read-only | missing | permission | adapter-unreadable
    path: str
    message: str


class StorageFault(Exception):
    """Raised (from the original error) where the runtime recognises a shared-volume fault itself."""

    def __init__(self, fault: Fault):
        super().__init__(fault.message)
        self.fault = fault


def under(path: str, root: str) -> bool:
    root, path = os.path.abspath(root), os.path.abspath(path)
    return root == "/" or path == root or path.startswith(root + "/")


def classify(exc: BaseException, roots: list[str], uid: int, gid: int, newest: str | None) -> Fault | None:
    """The shared-volume fault behind *exc*: a StorageFault's own, or an OSError (anywhere in its chain) that is
    EROFS, ENOENT, EACCES or EPERM on a path under one of *roots* (the run's directories on the shared volume); None
    for anything else (a bug, a bad config: reported as before)."""
    if isinstance(exc, StorageFault):
        return exc.fault
    for error in os_errors(exc):
        kind = KINDS.get(error.errno)
        path = error.filename if isinstance(error.filename, str) else None
        if kind and path and any(under(path, root) for root in roots):
            reason = error.strerror or str(error)
            seen = view(path)
            where = (seen.blocked or path) if kind == "missing" else nearest_existing(path)
            if where != path and kind != "missing":
                reason = f"{reason}, writing {os.path.relpath(path, where)}"
            if kind == "read-only":
                mount = mount_of(where)
                if mount is not None:
                    reason += f"; mount {mount.point} ({mount.fstype} {mount.source}, {mount.options})"
            return Fault(kind, where, storage_message(kind, where, reason, uid, gid, newest, seen))
    return None


def storage_message(kind: str, path: str, reason: str, uid: int, gid: int, newest: str | None,
                    seen: PathView | None = None) -> str:
    """One paragraph: the shared directory *path* is read-only / missing / denied to the trainer (uid:gid), what
    that means, what was kept, and what to do."""
    kept = (f"the newest complete checkpoint {newest} is kept" if newest else "no checkpoint was complete yet")
    what = {
        "read-only": (f"the shared directory {path} is read-only ({reason}) for the trainer (uid {uid}:{gid})",
                      "remount the share read-write (on the host: `mount | grep` the share; an NFS export may "
                      "have turned ro; a filesystem that went read-only after I/O errors needs a check)"),
        "missing": (f"the shared directory {path} is gone ({reason})"
                    + (f": {seen.words()}" if seen and seen.problem == "missing" else ""),
                    "mount the share again (or restore the run directory) at the same path on every host"),
        "permission": (f"the trainer (uid {uid}:{gid}) may not write {path} ({reason})"
                       + (f": {seen.words()}" if seen and seen.problem else ""),
                       f"give the run user its directory back, e.g. `chown -R {uid}:{gid} <dir>` and "
                       "`chmod -R u+rwX,go+rX <dir>` on the share"),
    }
    problem, fix = what.get(kind, (f"the shared directory {path} failed ({reason})", "check the share"))
    return f"shared volume: {problem}; the run stopped; {kept}. Fix: {fix}; {RESUME}."


def server_cannot_read(status: int | None, body: str | None) -> bool:
    """Whether a failed `POST /v1/load_lora_adapter` answer means the server could not read the adapter files."""
    return status is not None and status != 200 and bool(SERVER_CANNOT_READ.search(body or ""))


def server_reason(body: str | None) -> str:
    """The server's own words from a vLLM error body (`{"error": {"message": ...}}`), else the body's start."""
    import json

    try:
        message = json.loads(body or "").get("error", {}).get("message")
    except (ValueError, AttributeError):
        message = None
    text = str(message or body or "").strip()
    return text.split(", please check the stack trace")[0][:300]


def adapter_unreadable_message(name: str, path: str, status: int | None, body: str | None, uid: int, gid: int,
                               trainer_view: PathView) -> str:
    """The vLLM server could not read the adapter the trainer published: which path, the server's words, how the
    path looks to the trainer (same uid: preflight requires it), and what to do."""
    folder = os.path.dirname(path)
    if trainer_view.problem is None:
        differs = ("the trainer can read it, so the server host sees the directory differently (another owner or "
                   "mode there, NFS root squash, or another mount over it)")
    else:
        differs = f"as the trainer (uid {uid}:{gid}) sees it, {trainer_view.words()}"
    return (f"adapter unreadable: the vLLM server could not read adapter {name} at {path} (HTTP {status}: "
            f"{server_reason(body)}). This is a permission or mount problem on the shared volume, not a missing "
            f"endpoint. The server runs as uid {uid}:{gid}, as the trainer does (preflight requires it); {differs}. "
            f"Fix: make {folder} and its files readable to uid {uid} on the server host (`chown -R {uid}:{gid} "
            f"{folder}`, `chmod -R u+rwX,go+rX {folder}`; on NFS check the export's squash options), check with "
            f"`grpo-deploy preflight`, {RESUME}.")


class ShareGuard:
    """Notices the run directory on the shared volume going away between two writes: gone (ENOENT, ESTALE), or
    replaced — another filesystem at the same path, which is what a container sees when the share is unmounted under
    it (the image's empty mount point, where writes would silently land on local disk), or a recreated directory
    (its marker file, written when the guard is made, is missing). `check()` raises StorageFault; it costs a stat
    and the read of a few bytes."""

    MARKER = ".grpo-deploy-share"

    def __init__(self, path: str, uid: int, gid: int, newest=lambda: None):
        import uuid

        self.path, self.uid, self.gid, self.newest = os.path.abspath(path), uid, gid, newest
        self.device = os.stat(self.path).st_dev
        self.token: str | None = uuid.uuid4().hex
        try:
            with open(os.path.join(self.path, self.MARKER), "w", encoding="ascii") as handle:
                handle.write(self.token)
        except OSError:
            self.token = None  # a read-only run directory: the device check still holds

    def _fault(self, kind: str, reason: str, seen: PathView | None = None) -> StorageFault:
        return StorageFault(Fault(kind, self.path, storage_message(kind, self.path, reason, self.uid, self.gid,
                                                                   self.newest(), seen)))

    def check(self) -> None:
        try:
            device = os.stat(self.path).st_dev
        except OSError as error:
            raise self._fault(KINDS.get(error.errno, "missing"), error.strerror or str(error),
                              view(self.path)) from error
        replaced = ("another directory is at its path now (the share was unmounted or remounted elsewhere, or the "
                    "run directory was removed and recreated)")
        if device != self.device:
            raise self._fault("missing", replaced)
        if self.token is not None:
            try:
                with open(os.path.join(self.path, self.MARKER), encoding="ascii") as handle:
                    same = handle.read(64) == self.token
            except FileNotFoundError:
                same = False
            except OSError as error:  # EACCES and the like: the write that follows will say it precisely
                same = error.errno != errno.ESTALE
            if not same:
                raise self._fault("missing", replaced)


def main(argv: list[str] | None = None) -> int:
    """`python3 -m grpo_deploy.runtime.storage.faults view PATH`: how PATH looks to this process, as JSON (the
    deployer runs it in the server container, as the server's user, when the server could not read an adapter)."""
    import argparse
    import dataclasses
    import json

    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.storage.faults")
    parser.add_argument("action", choices=("view",))
    parser.add_argument("path")
    args = parser.parse_args(argv)
    print(json.dumps({**dataclasses.asdict(view(args.path)), "uid": os.getuid(), "gid": os.getgid()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
