"""What the kit writes to a terminal and how: escape sequences only where they are wanted (`escapes_ok`: a TTY, no
NO_COLOR, TERM not dumb) and long lines wrapped at the terminal's width under a hanging indent (`fit`); where the
output is not a terminal (a log file, a pipe) text leaves whole, one event a line, so that it stays grep-able.

Pure standard library; every escape sequence the kit writes (a redrawn progress line, a cleared screen) asks
`escapes_ok` first, and `up`'s progress lines, the build steps' lines and the run's summary leave through `fit`."""

from __future__ import annotations

import os
import re
import shutil
import textwrap
from collections.abc import Mapping
from typing import TextIO

FALLBACK_COLUMNS = 80  # a TTY whose size cannot be read
MIN_COLUMNS = 20  # narrower than this, wrapping helps no one: lines leave whole
SMALL_HANG = 4  # the hanging indent when the line's own prefix would take more than a third of the width
# A label column: leading spaces, a label (words with single spaces), then two or more spaces before the value.
_LABEL = re.compile(r"^ *\S+(?: \S+)*  +(?=\S)")
_SPACES = re.compile(r"(?<=\S)  +(?=\S)")


def is_tty(stream: TextIO) -> bool:
    """Whether *stream* is a terminal (a closed stream, or one without a descriptor, is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def escapes_ok(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the kit may write escape sequences (colour, a redrawn line, a cleared screen) to *stream*: only a
    terminal, never with NO_COLOR set to anything non-empty (no-color.org), never with TERM=dumb."""
    env = os.environ if environ is None else environ
    return is_tty(stream) and not env.get("NO_COLOR") and env.get("TERM") != "dumb"


def columns(stream: TextIO) -> int | None:
    """The width to wrap *stream*'s lines at: None when it is not a terminal (lines leave whole); else COLUMNS when
    set (as argparse and shutil read it), else the terminal's own size."""
    if not is_tty(stream):
        return None
    fallback = shutil.get_terminal_size((FALLBACK_COLUMNS, 24)).columns
    if os.environ.get("COLUMNS", "").isdigit():
        return fallback
    try:
        return os.get_terminal_size(stream.fileno()).columns or fallback
    except (AttributeError, ValueError, OSError):
        return fallback


def wrap(text: str, width: int | None, prefix: str = "") -> list[str]:
    """*prefix* + *text* as lines no wider than *width*, broken between words only, each later line under a hanging
    indent: the prefix's width (or the line's label column), SMALL_HANG when that is over a third of the width. A
    word longer than a line keeps a line of its own, whole (a path copied from the terminal stays one path). A line
    after a *prefix* that fits once its runs of spaces are single ones is printed so (a step's figures stay one
    row); without a prefix the runs are kept (they align a label column). A line of *text* stays a line; width None:
    nothing is wrapped."""
    out: list[str] = []
    for n, line in enumerate(text.split("\n")):
        head = prefix if n == 0 else " " * len(prefix)
        whole = head + line
        if width is None or width < MIN_COLUMNS or len(whole) <= width:
            out.append(whole)
            continue
        if prefix and len(squeezed := head + _SPACES.sub(" ", line)) <= width:
            out.append(squeezed)
            continue
        label = _LABEL.match(whole) if not prefix else None
        hang = len(prefix) if prefix else len(label.group()) if label else len(whole) - len(whole.lstrip(" "))
        if hang > width // 3:
            hang = SMALL_HANG
        out.extend(textwrap.wrap(whole, width, subsequent_indent=" " * hang, break_long_words=False,
                                 break_on_hyphens=False, replace_whitespace=False, drop_whitespace=True)
                   or [whole])
    return out


def fit(text: str, stream: TextIO, prefix: str = "") -> str:
    """*prefix* + *text* as it should reach *stream*: wrapped at the terminal's width under a hanging indent on a
    terminal (`wrap`), whole elsewhere."""
    return "\n".join(wrap(text, columns(stream), prefix))


def cut(line: str, width: int) -> str:
    """*line* cut to *width* columns for a line redrawn in place (it must stay one row): '...' marks the cut."""
    return line if len(line) <= width else line[:max(0, width - 3)] + "..."
