"""Reading back a file the kit did not write (a spec, a render to check, a checkpoint's state files): the one reader,
bounded, regular files only, the last component never followed as a link, text checked as UTF-8. Each refusal is a
ReadRefused whose message is one line (the path, what it is, what to do) and whose `kind` says which case it was.

Pure standard library: runs inside the images too (the checkpoint manager)."""

from __future__ import annotations

import errno
import os
import stat

MiB = 1 << 20
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) \
    | getattr(os, "O_CLOEXEC", 0)
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


class ReadRefused(ValueError):
    """The file cannot be read back safely. kind: missing | link | not-regular | too-big | not-utf8 | unreadable."""

    def __init__(self, kind: str, message: str, size: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.size = size  # too-big: the size when the file said it


def shown_path(path: str | os.PathLike) -> str:
    """A path as a message shows it: as it is, or quoted when it holds an unprintable character (one line)."""
    text = os.fspath(path)
    return text if text.isprintable() else repr(text)


def file_kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: str | os.PathLike, limit: int, what: str = "the file", *, head: bool = False) -> bytes:
    """The bytes of the regular file *path*, at most *limit* of them; never follows a link at *path*, never blocks on
    a FIFO or a device, never reads past limit + 1 bytes (a sparse or growing file is refused, not read whole).
    head: the first *limit* bytes of a longer file instead of a refusal."""
    shown = shown_path(path)
    if "\x00" in os.fspath(path):
        raise ReadRefused("unreadable", f"{shown}: a path cannot hold a NUL byte; check the path")
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise ReadRefused("missing", f"{shown}: no such file; check the path") from None
    except IsADirectoryError:
        raise ReadRefused("not-regular", f"{shown}: is a directory, not {what}; pass the file itself") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise ReadRefused("link", f"{shown}: is a symbolic link; the kit reads {what} only as a regular file, "
                                      "never through a link: pass the file it points to") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise ReadRefused("unreadable", f"{shown}: permission denied reading the file; make it readable by this "
                                            "user "
                                            "(e.g. chmod u+r) or run as a user who can read it") from None
        raise ReadRefused("unreadable", f"{shown}: cannot read it ({exc.strerror or exc}); check the path and that "
                                        "it is a regular file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReadRefused("not-regular", f"{shown}: is {file_kind(st.st_mode)}, not a regular file; the kit "
                                             f"reads {what} only from a regular file: pass one")
        if st.st_size > limit and not head:
            raise _too_big(shown, what, st.st_size, limit)
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(limit + 1 - total, MiB))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        data = b"".join(chunks)
        if total > limit and not head:
            raise _too_big(shown, what, None, limit)
        return data[:limit]
    except OSError as exc:
        raise ReadRefused("unreadable", f"{shown}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _too_big(shown: str, what: str, size: int | None, limit: int) -> ReadRefused:
    is_ = f"is {size} bytes" if size is not None else f"holds more than {limit} bytes"
    return ReadRefused("too-big", f"{shown}: {is_}; {what} is at most {_human(limit)}: this is not {what} "
                                  "(or it was damaged): check the path", size)


def _human(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} bytes"


def line_at(raw: bytes, offset: int) -> int:
    return raw.count(b"\n", 0, offset) + 1


def decode(raw: bytes, shown: str, what: str = "the file") -> str:
    """*raw* as UTF-8 text; a refusal names the line and offset of the first byte that is not (never the bytes around
    it: the file may not be what the kit expected to read)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReadRefused("not-utf8", f"{shown}:{line_at(raw, exc.start)}: not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                                      f"at offset {exc.start}); {what} must be UTF-8 text") from None


def read_text(path: str | os.PathLike, limit: int, what: str = "the file") -> str:
    """read_bytes, then decode."""
    return decode(read_bytes(path, limit, what), shown_path(path), what)
