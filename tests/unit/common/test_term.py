"""Tests of grpo_deploy.common.term: wrapping at a width, and the terminal checks against a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import io
import os
import struct
import termios
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from grpo_deploy.common.term import cut, escapes_ok, fit, is_tty, wrap

WATCHER = ("run watcher: 88.5% of answers hit the 24-token length cap over the last 1 logged steps (bound 20%; mean "
           "length 23.4): raise max_completion_length, or use a per-token loss (packing) so long answers stop growing")


@contextmanager
def pty_of(cols: int, rows: int = 24) -> Iterator[TextIO]:
    """A real pseudo-terminal *cols* wide: its writing end as a text stream."""
    main, side = os.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    stream = open(side, "w", closefd=True)  # noqa: SIM115 - closed below
    try:
        yield stream
    finally:
        stream.close()
        os.close(main)


def test_a_long_progress_line_wraps_between_words_under_the_timestamp():
    lines = wrap(WATCHER, 80, "[14:02:07] ")
    assert len(lines) == 4 and all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("[14:02:07] run watcher: 88.5%")
    assert all(line.startswith(" " * 11) and line[11] != " " for line in lines[1:]), "hanging indent of 11"
    assert " ".join(line.strip() for line in lines) == "[14:02:07] " + WATCHER, "no word cut, none lost"


def test_no_width_means_whole_lines_and_a_short_line_is_untouched():
    assert wrap(WATCHER, None, "[14:02:07] ") == ["[14:02:07] " + WATCHER]
    step = "step 1/40  reward 0.043  len 23.4"
    assert wrap(step, 80, "[14:02:07] ") == ["[14:02:07] " + step]
    assert wrap(WATCHER, 10) == [WATCHER], "narrower than MIN_COLUMNS: whole"


def test_a_summary_line_wraps_under_its_label_column():
    line = ("  start-up            server ready 36.2 s; up -> first step 54.3 s (image build 193.2 s, not counted) and "
            "more words, more than eighty columns")
    lines = wrap(line, 80)
    assert len(lines) == 3 and all(len(x) <= 80 for x in lines) and lines[0].startswith("  start-up            server")
    assert all(x.startswith(" " * 22) and x[22] != " " for x in lines[1:]), lines


def test_a_long_prefix_hangs_by_four_and_a_long_word_stays_whole():
    prefix = "dependency image grpo-deploy/cpu-deps:fd5fd326dc85-amd64: "
    lines = wrap("started (log: /var/tmp/grpo-fresh-engine/src/build/logs/image-cpu-deps.log)", 80, prefix)
    assert lines == [prefix + "started (log:", "    /var/tmp/grpo-fresh-engine/src/build/logs/image-cpu-deps.log)"]
    path = "/shared/" + "x" * 90
    lines = wrap(f"probe {path} written", 80, "[14:01:11] ")
    assert " " * 11 + path in lines, "a path copied from the terminal is one path"


def test_each_line_of_a_message_stays_a_line():
    assert wrap("first\nsecond", 80, "[00:00:00] ") == ["[00:00:00] first", "           second"]


def test_columns_and_fit_on_a_real_terminal(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    with pty_of(80) as tty:
        assert is_tty(tty)
        assert fit(WATCHER, tty, "[14:02:07] ") == "\n".join(wrap(WATCHER, 80, "[14:02:07] "))
    with pty_of(120) as tty:
        assert max(len(x) for x in fit(WATCHER, tty, "[14:02:07] ").splitlines()) <= 120
    assert fit(WATCHER, io.StringIO(), "[14:02:07] ") == "[14:02:07] " + WATCHER, "not a terminal: one line"


def test_escapes_only_on_a_terminal_without_no_color_or_a_dumb_term():
    with pty_of(80) as tty:
        assert escapes_ok(tty, {"TERM": "xterm"})
        assert not escapes_ok(tty, {"TERM": "xterm", "NO_COLOR": "1"})
        assert not escapes_ok(tty, {"TERM": "xterm", "NO_COLOR": "yes please"})
        assert escapes_ok(tty, {"TERM": "xterm", "NO_COLOR": ""}), "an empty NO_COLOR is unset (no-color.org)"
        assert not escapes_ok(tty, {"TERM": "dumb"})
    assert not escapes_ok(io.StringIO(), {"TERM": "xterm"})
    closed = io.StringIO()
    closed.close()
    assert not is_tty(closed) and not escapes_ok(closed, {})


def test_a_redrawn_line_is_cut_with_a_mark():
    assert cut("x" * 50, 40) == "x" * 37 + "..." and cut("short", 40) == "short"


def test_a_step_line_that_fits_with_single_spaces_stays_one_row():
    step = "step 1/40  reward 0.043  len 23.4  staleness 0.00  ratio 1.0000  queue 4"
    assert wrap(step, 80, "[14:02:07] ") == ["[14:02:07] step 1/40 reward 0.043 len 23.4 staleness 0.00 ratio 1.0000 "
                                              "queue 4"]
    assert wrap(step, 120, "[14:02:07] ") == ["[14:02:07] " + step], "wide enough: as it was"
    assert all(len(x) <= 60 for x in wrap(step, 60, "[14:02:07] ")), "too long even so: wrapped"
