"""A render on disk: write one to a folder (the CLI, `up`, the committed defaults), compare a folder with one, and
read its KEY=VALUE env files back.

A folder the kit wrote holds a record, RECORD, whose first line is RECORD_HEADER and whose other lines are
"<sha256 of the content>  <relative path>", one per file written. Only a regular file with that exact first line makes
a folder "an earlier render" (a name of the kit's own, not a generic MANIFEST that a user's folder may well hold).
write_tree writes into a new folder, an empty one or an earlier render, and on a re-render removes only files that
record lists and that still hold what the kit wrote (then the folders that leaves empty). Everything else in the
folder is someone else's and stays as it is.

A write is all or nothing (grpo_deploy.render.scratch): the files are staged in a scratch folder, then moved into
place with the record last, so a full disk, an interrupt or an error leaves the earlier render (or nothing) and a
record that is true; the folder is not swapped whole, so folders stay the same folders and files that are not the
kit's stay where they are.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from grpo_deploy.common.dirlock import Busy, locked
from grpo_deploy.common.readback import ReadRefused, read_bytes
from grpo_deploy.render import scratch

RECORD = ".grpo-deploy-render"
RECORD_HEADER = "# grpo-deploy render record, format 1"
_RECORD_KIT = "# grpo-deploy render record"  # the header without its format: another version's record
_HASH_LEN = 64
FILE_LIMIT = 16 << 20  # a rendered file is a few KB; a file past this in a render folder is not one the kit wrote


class WriteRefused(Exception):
    """write_tree would write where it must not (a foreign folder or file, a symbolic link, a file in the way).
    Nothing was written; the message is one line that says what and how to fix it."""


class WriteFailed(WriteRefused):
    """The system failed the write (a full disk, a quota, a read-only or failing device): the folder holds what it held
    before. The message is one line; *reason* is the message without the folder."""

    def __init__(self, out_dir: Path, failed: scratch.Failed):
        what = "no space left on the device" if failed.errno == errno.ENOSPC else \
            failed.strerror[:1].lower() + failed.strerror[1:]
        if failed.kept:
            outcome = (f"the earlier render is not back in place yet: the next render into {out_dir} puts it back "
                       f"first ({failed.kept} holds it)")
        else:
            outcome = "nothing was changed" + (": free some space or render into another directory"
                                               if failed.errno in (errno.ENOSPC, errno.EDQUOT) else "")
        self.reason = f"{what} (wrote {failed.written} of {failed.total} bytes); {outcome}"
        super().__init__(f"{out_dir}: {self.reason}")


def write_tree(files: dict[str, str], out_dir: Path, *, adopt: bool = False,
               on_write: scratch.Hook | None = None) -> list[Path]:
    """Write {relative path: text} under *out_dir* and record them; the paths written, in the order of *files*.

    *out_dir* must be new, empty or an earlier render (see the module docstring); a file of the render at a path that
    the earlier record does not list is refused, not overwritten. adopt: a folder without a record (files the kit
    wrote before it kept one) may hold such files when their content equals what is written now.
    All or nothing (grpo_deploy.render.scratch): a failure raises WriteFailed, an interrupt propagates, and either
    leaves the folder as it was, with folders the same folders (a container bind-mounting config/ keeps seeing it).
    Nothing is written through, or removed at, a symbolic link. Every check runs before the first write; a refusal
    raises WriteRefused with the folder untouched. on_write (tests): called with ("stage" or "move", relative path)
    before each file is written into the scratch folder and before each is moved into place.
    """
    out_dir = Path(out_dir)
    _check_paths(files)
    made = [p for p in (out_dir.parent, *out_dir.parent.parents) if not os.path.lexists(p)]  # deepest first
    out_dir.parent.mkdir(parents=True, exist_ok=True)  # only when out_dir is new too: nothing there can be refused
    try:
        with locked(out_dir.parent, f"a render into {out_dir.name}"):  # the parent: out_dir itself may be new
            return _write_locked(files, out_dir, adopt, on_write)
    except Busy as exc:
        raise WriteRefused(str(exc)) from None
    finally:
        for folder in made:  # made for this render: a failed one leaves none of them behind
            try:
                folder.rmdir()
            except OSError:
                break


def _write_locked(files: dict[str, str], out_dir: Path, adopt: bool, on_write: scratch.Hook | None) -> list[Path]:
    scratch.recover(out_dir)  # an earlier write cut short (a crash) is rolled back first
    _, stale = _checked(files, out_dir, adopt)
    lines = [RECORD_HEADER] + [f"{_digest(text)}  {rel}" for rel, text in sorted(files.items())]
    staged = [(rel, text.encode("utf-8")) for rel, text in files.items()]
    try:
        scratch.put(out_dir, staged + [(RECORD, ("\n".join(lines) + "\n").encode("utf-8"))], stale, on_write)
    except scratch.Failed as exc:
        raise WriteFailed(out_dir, exc) from None
    return [out_dir / rel for rel in files]


def check_tree(files: dict[str, str], out_dir: Path, *, adopt: bool = False) -> None:
    """write_tree's checks alone: raises the WriteRefused it would raise, writes nothing (several folders are checked
    before any is written)."""
    _checked(files, Path(out_dir), adopt)


def _checked(files: dict[str, str], out_dir: Path, adopt: bool) -> tuple[dict[str, str], list[str]]:
    """Every refusal, before anything is written; then what the earlier record lists, and its stale files to remove."""
    _check_paths(files)
    previous = _earlier_render(out_dir, adopt)
    for rel, text in files.items():
        _check_target(out_dir, rel, text, rel in previous, adopt)
    stale = [rel for rel, digest in sorted(previous.items()) if rel not in files and _unchanged(out_dir, rel, digest)]
    return previous, stale


def read_record(out_dir: Path) -> dict[str, str] | None:
    """{relative path: sha256} from *out_dir*'s record; None when *out_dir* holds no record of this kit."""
    text = _record_text(Path(out_dir) / RECORD)
    return None if text is None else _parse_record(Path(out_dir) / RECORD, text)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_paths(files: dict[str, str]) -> None:
    for rel in files:
        if not _valid_rel(rel):
            raise ValueError(f"not a relative path inside the render: {rel!r}")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in files:
                raise ValueError(f"{'/'.join(parts[:i])!r} is both a file and a folder of the render")


def _valid_rel(rel: str) -> bool:
    parts = rel.split("/")
    return (bool(rel) and rel != RECORD and not any(c in rel for c in "\n\r\0\\")
            and not any(p in ("", ".", "..") for p in parts))


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _record_text(record: Path) -> str | None:
    """The record's text when *record* is a regular file that starts with this kit's header, else None."""
    try:
        text = read_bytes(record, FILE_LIMIT, "a render record").decode("utf-8")
    except (ReadRefused, UnicodeDecodeError):
        return None
    return text if text.split("\n", 1)[0] == RECORD_HEADER else None


def _parse_record(record: Path, text: str) -> dict[str, str]:
    entries = {}
    for number, line in enumerate(text.split("\n")[1:], 2):
        if not line:
            continue
        digest, sep, rel = line[:_HASH_LEN], line[_HASH_LEN:_HASH_LEN + 2], line[_HASH_LEN + 2:]
        if sep != "  " or len(digest) != _HASH_LEN or digest.strip("0123456789abcdef") or not _valid_rel(rel):
            raise WriteRefused(f"{record} line {number} is not '<sha256>  <relative path>': the record is damaged; "
                               "repair or remove it (the folder then counts as not the kit's), or choose a new folder")
        entries[rel] = digest
    return entries


def _earlier_render(out_dir: Path, adopt: bool) -> dict[str, str]:
    """What the record in *out_dir* lists ({} for a new or empty folder, or one adopted); refuses anything else."""
    st = _lstat(out_dir)
    if st is None:
        return {}
    if stat.S_ISLNK(st.st_mode):
        raise WriteRefused(f"{out_dir} is a symbolic link; grpo-deploy does not write through links: "
                           "pass a real directory or a new path")
    if not stat.S_ISDIR(st.st_mode):
        raise WriteRefused(f"{out_dir} exists and is not a directory; choose a new or empty directory")
    record = out_dir / RECORD
    if _lstat(record) is not None:
        text = _record_text(record)
        if text is not None:
            return _parse_record(record, text)
        first = _first_line(record) if stat.S_ISREG(os.lstat(record).st_mode) else ""
        if first.startswith(_RECORD_KIT):
            raise WriteRefused(f"{record} was written by another version of grpo-deploy ({first!r}); re-render with "
                               "that version or choose a new directory")
        raise WriteRefused(f"{record} is not a grpo-deploy render record (a link or another file); move it away or "
                           "choose a new directory")
    if adopt or not any(out_dir.iterdir()):
        return {}
    raise WriteRefused(f"{out_dir} is not empty and holds no earlier grpo-deploy render (no {RECORD} record); "
                       "choose a new or empty directory")


def _first_line(path: Path) -> str:
    try:
        head = read_bytes(path, 200, "a render record", head=True)
    except ReadRefused:
        return ""
    return head.split(b"\n", 1)[0].decode("utf-8", "replace")


def _check_target(out_dir: Path, rel: str, text: str, listed: bool, adopt: bool) -> None:
    fix = "move it away or choose another directory"
    path = out_dir
    for part in rel.split("/")[:-1]:
        path = path / part
        st = _lstat(path)
        if st is None:
            return  # the rest of the way is created
        if stat.S_ISLNK(st.st_mode):
            raise WriteRefused(f"{path} is a symbolic link where the render needs a folder "
                               f"(grpo-deploy does not write through links); {fix}")
        if not stat.S_ISDIR(st.st_mode):
            raise WriteRefused(f"{path} is a file where the render needs a folder; {fix}")
    target = out_dir / rel
    st = _lstat(target)
    if st is None:
        return
    if stat.S_ISLNK(st.st_mode):
        raise WriteRefused(f"{target} is a symbolic link where the render writes a file "
                           f"(grpo-deploy does not write through links); {fix}")
    if not stat.S_ISREG(st.st_mode):
        raise WriteRefused(f"{target} is not a regular file (a folder or device) where the render writes a file; {fix}")
    if listed:
        return
    if adopt and _content(target) == text.encode("utf-8"):
        return
    why = "its content differs from the render" if adopt else "the earlier render's record does not list it"
    raise WriteRefused(f"{target} exists and is not a file this kit wrote ({why}); {fix}")


def _unchanged(out_dir: Path, rel: str, digest: str) -> bool:
    """Whether the listed file *rel* is still what the kit wrote (a regular file, no link on the way, same content):
    only then is it removed as stale. An edited file is someone's now and stays."""
    path = out_dir
    for part in rel.split("/"):
        path = path / part
        st = _lstat(path)
        if st is None or stat.S_ISLNK(st.st_mode):
            return False
    if not stat.S_ISREG(st.st_mode):
        return False
    data = _content(path)
    return data is not None and hashlib.sha256(data).hexdigest() == digest


def _content(path: Path) -> bytes | None:
    """A file's bytes through the bounded no-follow reader; None when it is not a regular file within the limit."""
    try:
        return read_bytes(path, FILE_LIMIT, "a rendered file")
    except ReadRefused:
        return None


def diff_tree(files: dict[str, str], out_dir: Path) -> list[str]:
    """How *out_dir* differs from *files*: one line per path, "missing  rel", "differs  rel" or "extra    rel" (the
    render record at the top is not a render file and not extra)."""
    out_dir = Path(out_dir)
    problems = []
    for rel, text in sorted(files.items()):
        why = _read_back(out_dir, rel, text)
        if why:
            problems.append(why)
    st = _lstat(out_dir)
    if st is not None and stat.S_ISDIR(st.st_mode):
        for root, dirs, names in os.walk(out_dir):  # never into a linked folder
            dirs.sort()
            for name in sorted(names):
                rel = (Path(root) / name).relative_to(out_dir).as_posix()
                if rel not in files and rel != RECORD:
                    problems.append(f"extra    {rel}")
    return problems


def _read_back(out_dir: Path, rel: str, text: str) -> str | None:
    """How the file *rel* on disk differs from *text* (None: equal), read through the bounded no-follow reader: a
    link on the way, a FIFO, a device, a huge or non-UTF-8 file is a difference, never followed or read whole."""
    path = out_dir
    for part in rel.split("/")[:-1]:
        path = path / part
        st = _lstat(path)
        if st is None:
            return f"missing  {rel}"
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            return f"differs  {rel} ({path.relative_to(out_dir).as_posix()} is not a folder but a link or a file)"
    try:
        data = read_bytes(out_dir / rel, max(FILE_LIMIT, len(text.encode('utf-8'))), "a rendered file")
    except ReadRefused as exc:
        if exc.kind == "missing":
            return f"missing  {rel}"
        reason = str(exc).split(": ", 1)[-1].split(";")[0]
        return f"differs  {rel} ({reason})"
    return None if data == text.encode("utf-8") else f"differs  {rel}"


def parse_env(text: str) -> dict[str, str]:
    """A rendered KEY=VALUE env file as a dict: blank and `#` lines skipped, each other line split on its first `=`
    (nothing stripped or unquoted: the value is the rest of the line, as Docker's env files read it)."""
    env = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"line {number} is not KEY=VALUE: {line!r}")
        env[key] = value
    return env
