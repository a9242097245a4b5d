"""All or nothing for a render on disk: its files are written into a scratch folder first, then moved into place, so
a full disk, an interrupt or an error leaves the folder as it was (grpo_deploy.render.folder decides what is written
and where it may be; this module only makes that write whole).

The choice (issue 44): a render folder is not swapped whole for a new one. Containers of a run bind-mount its config/
and must keep seeing that folder; the folder may hold files the kit did not write, which must stay; a mount point
cannot be renamed. So:
- Stage: every file, the render record last, is written and fsynced into a scratch folder (mode 0700, made with
  mkdir, which never follows a link): beside a new target (`.<name>.render-<hex>`), inside an existing one
  (`.grpo-deploy-render.scratch-<hex>`: the same filesystem as the files it replaces, and no write permission needed
  on the parent). A full disk shows here, before anything in the target has changed.
- Move: a new target is the staged folder renamed into place (one rename). In an existing one each file is renamed
  over the old one (a reader sees the old file or the new, never a part of one), after a hard link to the old one is
  kept in the scratch folder (the old one is moved there where the filesystem has no hard links); the files of the
  earlier render that this one lacks are moved there too; the record comes last, and its rename is the commit point.
- An exception or an interrupt before the commit point puts every kept file back and removes what was moved in;
  after it, the scratch folder is removed. A crash (power, SIGKILL) between the first move and the commit point
  leaves the scratch folder with its list of moves: the next write into that folder rolls back first (recover(),
  under the folder's lock); past the commit point it only removes the scratch folder.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from grpo_deploy.common.readback import ReadRefused, read_bytes

INSIDE = ".grpo-deploy-render.scratch-"  # the scratch folder's name inside an existing render folder
MOVES = "moves"  # in the scratch folder: the files moved in, one a line, in order; the last is the commit point
_HEX = 16
_NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.ENOSYS)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

Hook = Callable[[str, str], None]  # (step, relative path): "stage" as a file is written, "move" before it moves in


class Failed(Exception):
    """The system failed the write (errno, strerror); *written* of *total* bytes had been staged. The folder is as it
    was, unless putting it back failed too: then *kept* is the scratch folder (the next write finishes the job)."""

    def __init__(self, exc: OSError, written: int, total: int, kept: Path | None):
        super().__init__(exc.strerror or str(exc))
        self.errno, self.strerror = exc.errno, exc.strerror or str(exc)
        self.written, self.total, self.kept = written, total, kept


def put(out: Path, files: list[tuple[str, bytes]], stale: list[str], hook: Hook | None = None) -> None:
    """Write *files* ((relative path, bytes), the last one the commit point) under *out* and move the *stale* files
    (of the earlier render, not in this one) out of it: all of it, or Failed (or the interrupt) with *out* as it was.
    *hook* (tests) is called before each file is written and before each move; what it raises is an interrupt."""
    hook = hook or _nothing
    fresh = not os.path.lexists(out)
    written, total = [0], sum(len(data) for _, data in files)
    try:
        scratch = _scratch(out.parent, f".{out.name}.render-") if fresh else _scratch(out, INSIDE)
    except OSError as exc:
        raise Failed(exc, 0, total, None) from None
    made: list[Path] = []
    try:
        _stage(out, scratch / "new", files, hook, written)
        if fresh:
            hook("move", ".")
            os.rename(scratch / "new", out)
        else:
            _write(scratch / f"{MOVES}.tmp", "".join(f"{rel}\n" for rel, _ in files).encode(), lambda: None, [0])
            os.rename(scratch / f"{MOVES}.tmp", scratch / MOVES)  # whole or absent: a part would name other files
            _move_in(out, scratch, [rel for rel, _ in files], stale, hook, made)
    except BaseException as exc:
        kept = _undo(out, scratch, made, fresh)
        if isinstance(exc, OSError):
            raise Failed(exc, written[0], total, kept) from None
        raise
    _finish(out.parent if fresh else out, scratch)


def recover(out: Path) -> None:
    """Finish what an interrupted write left (call under the folder's lock): a scratch folder of this kit beside *out*
    (a new target's: nothing of it is in place) is removed; one inside *out* is rolled back before its commit point
    and removed. Folders of another user or of another name are not this kit's and stay."""
    if os.path.isdir(out.parent):
        for scratch in _leftovers(out.parent, re.compile(rf"\.{re.escape(out.name)}\.render-[0-9a-f]{{{_HEX}}}")):
            shutil.rmtree(scratch)
    st = _lstat(out)
    if st is None or not stat.S_ISDIR(st.st_mode):  # new, or a link (never looked into)
        return
    for scratch in _leftovers(out, re.compile(rf"{re.escape(INSIDE)}[0-9a-f]{{{_HEX}}}")):
        moves = _moves(scratch)
        if moves and os.path.lexists(scratch / "new" / moves[-1]):
            _roll_back(out, scratch, None)
        _finish(out, scratch)


def _nothing(step: str, rel: str) -> None:
    return None


def _scratch(home: Path, prefix: str) -> Path:
    while True:
        path = home / f"{prefix}{secrets.token_hex(_HEX // 2)}"
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def _stage(out: Path, new: Path, files: list[tuple[str, bytes]], hook: Hook, written: list[int]) -> None:
    """Every file under *new*, fsynced, with the mode of the file it replaces (a new one: 0666 less the umask)."""
    os.mkdir(new)
    for rel, data in files:
        os.makedirs((new / rel).parent, exist_ok=True)  # inside the scratch folder: nothing there is anyone else's
        st = _lstat(out / rel)
        _write(new / rel, data, functools.partial(hook, "stage", rel), written,
               stat.S_IMODE(st.st_mode) if st is not None and stat.S_ISREG(st.st_mode) else None)
    for root, _, _ in os.walk(new):
        _fsync_dir(Path(root))


def _write(path: Path, data: bytes, started: Callable[[], None], written: list[int], mode: int | None = None) -> None:
    fd = os.open(path, _CREATE, 0o666)
    try:
        started()
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            written[0] += n
            view = view[n:]
        if mode is not None:
            os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_in(out: Path, scratch: Path, rels: list[str], stale: list[str], hook: Hook, made: list[Path]) -> None:
    new, old = scratch / "new", scratch / "old"
    for rel in rels[:-1]:
        _folders(out, rel, made)
        _keep(out / rel, old / rel)
        hook("move", rel)
        os.replace(new / rel, out / rel)
    for rel in stale:
        os.makedirs((old / rel).parent, exist_ok=True)
        hook("move", rel)
        os.rename(out / rel, old / rel)
    _keep(out / rels[-1], old / rels[-1])
    hook("move", rels[-1])
    os.replace(new / rels[-1], out / rels[-1])  # the commit point


def _keep(target: Path, backup: Path) -> None:
    """A hard link to *target* at *backup*, or *target* moved there where the filesystem has no hard links."""
    if not os.path.lexists(target):
        return
    os.makedirs(backup.parent, exist_ok=True)
    try:
        os.link(target, backup, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        os.rename(target, backup)


def _folders(out: Path, rel: str, made: list[Path]) -> None:
    """Make the folders of *rel* under *out* that are missing, each added to *made*. One that is now a link or a file
    (it was checked as a folder) fails the write."""
    path = out
    for part in rel.split("/")[:-1]:
        path = path / part
        try:
            os.mkdir(path)
            made.append(path)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "changed while writing (now not a folder)", str(path)) from None


def _undo(out: Path, scratch: Path, made: list[Path], fresh: bool) -> Path | None:
    """After a failure: the folder as it was and no scratch folder; the scratch folder when that failed too."""
    try:
        if not fresh:
            _roll_back(out, scratch, made)
        shutil.rmtree(scratch)
    except OSError:
        return scratch
    return None


def _roll_back(out: Path, scratch: Path, made: list[Path] | None) -> None:
    """Remove what the moves put where nothing was, put every kept file back, remove the folders *made* (None, after
    a crash: the folders on the way to a file of the moves that is not there, when empty)."""
    new, old = scratch / "new", scratch / "old"
    moves = _moves(scratch)
    for rel in moves:
        if not os.path.lexists(new / rel) and not os.path.lexists(old / rel) and _inside(out, rel):
            st = _lstat(out / rel)
            if st is not None and stat.S_ISREG(st.st_mode):
                os.unlink(out / rel)
    for rel in _files(old):
        if _inside(out, rel):
            os.replace(old / rel, out / rel)
    if made is None:
        made = [(out / rel).parent for rel in moves if not os.path.lexists(out / rel)]
    for folder in reversed(made):
        _remove_emptied(out, folder)


def _finish(home: Path, scratch: Path) -> None:
    """Past the commit point: the folders the stale files leave empty and the scratch folder go (an error here
    leaves the scratch folder for the next write to remove: the render itself is whole)."""
    for rel in _files(scratch / "old"):
        _remove_emptied(home, (home / rel).parent)
    shutil.rmtree(scratch, ignore_errors=True)
    _fsync_dir(home)


def _moves(scratch: Path) -> list[str]:
    """The scratch folder's list of moves (only plain relative paths; none when it is missing or unreadable)."""
    try:
        text = read_bytes(scratch / MOVES, 16 << 20, "a render's list of moves").decode("utf-8")
    except (ReadRefused, UnicodeDecodeError):
        return []
    return [rel for rel in text.split("\n") if _plain(rel)]


def _plain(rel: str) -> bool:
    return bool(rel) and not any(c in rel for c in "\r\0\\") and not any(
        p in ("", ".", "..") for p in rel.split("/"))


def _files(folder: Path) -> list[str]:
    """The regular files under *folder* (not through links), as relative paths."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            if stat.S_ISREG(os.lstat(path).st_mode):
                found.append(path.relative_to(folder).as_posix())
    return found


def _inside(out: Path, rel: str) -> bool:
    """Whether every folder on the way to *rel* under *out* is a real folder (a file is never put through a link)."""
    path = out
    for part in rel.split("/")[:-1]:
        path = path / part
        st = _lstat(path)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return False
    return True


def _leftovers(folder: Path, name: re.Pattern) -> list[Path]:
    """The folders in *folder* named by *name* that this user made (a link, a file or another user's one is not)."""
    found = []
    for entry in sorted(os.listdir(folder)):
        if name.fullmatch(entry):
            st = os.lstat(folder / entry)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                found.append(folder / entry)
    return found


def _remove_emptied(out: Path, folder: Path) -> None:
    """Remove *folder* and its parents below *out* while they are empty (rmdir never removes a link or a folder with
    something in it)."""
    while folder != out and out in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # a filesystem that cannot sync a folder
    finally:
        os.close(fd)
