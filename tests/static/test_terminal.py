"""What a user sees in a real terminal (tmux, 80 and 120 columns): `grpo-deploy --help` and every verb's help, and
`up`'s progress (a recorded run re-printed through the kit's printing functions: scripts/replay_up.py), fit the width
with no line cut by the terminal; no escape sequence with NO_COLOR or where stdout is not a terminal.

One private tmux server (its own socket, no user config) serves every case of the module."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from tests.tmux_pane import CLEAN, ROOT, Pane, Tmux, TmuxMissing

RECORDED = ROOT / "tests" / "static" / "terminal" / "up_fresh_pipe.log"
WIDTHS = (80, 120)
MARK = "=== help of:"  # tests/terminal_helps.py's line before each help


@pytest.fixture(scope="module")
def tmux():
    try:
        server = Tmux()
    except TmuxMissing as exc:
        pytest.fail(str(exc))
    yield server
    server.close()


def _expected_help_rows(record: dict) -> list[str]:
    rows = []
    for one in record["helps"]:
        rows.append(f"{MARK} {' '.join(one['path']) or '-'}")
        rows.extend(line.rstrip() for line in one["text"].rstrip("\n").split("\n"))
    return rows


def _helps_in(tmux: Tmux, columns: int, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[dict, Pane]:
    record = tmp_path / f"helps-{columns}-{len(env or {})}.json"
    pane = tmux.run([sys.executable, "-m", "tests.terminal_helps", str(record)], columns, env)
    if not record.is_file():
        pytest.fail("tests.terminal_helps wrote no record; the pane showed:\n" + "\n".join(pane.rows[-30:]))
    return json.loads(record.read_text()), pane


@pytest.mark.parametrize("columns", WIDTHS)
def test_every_help_fits_the_terminal(tmux, tmp_path, columns):
    """argparse wrote every help for this terminal's width, and the terminal shows it as written: no row it had to
    wrap (a wrapped row cuts a word where argparse would not), every verb and sub-verb there."""
    record, pane = _helps_in(tmux, columns, tmp_path)
    assert record["isatty"] and record["columns"] == columns, "the helps did not run in a terminal of that width"
    paths = [" ".join(h["path"]) for h in record["helps"]]
    assert {"", "up", "status", "k8s render", "images build", "bench trainer"} <= set(paths), paths
    wide = [(p, line) for p, h in zip(paths, record["helps"], strict=True) for line in h["text"].splitlines()
            if len(line) > columns]
    assert not wide, f"help lines wider than {columns} columns (verb, line): {wide[:5]}"
    split = [(p, a.strip()[-20:], b.strip()[:20]) for p, h in zip(paths, record["helps"], strict=True)
             for a, b in pairwise(h["text"].splitlines()) if re.search(r"\w-$", a) and re.match(r" *\w", b)]
    assert not split, f"a hyphenated name split over two lines (verb, end, next): {split[:5]}"
    expected = _expected_help_rows(record)
    assert pane.joined == expected, _first_difference(pane.joined, expected)
    assert pane.rows == pane.joined, f"the terminal wrapped a row: {_first_difference(pane.rows, pane.joined)}"


def test_no_escape_sequence_with_no_color_or_without_a_terminal(tmux, tmp_path):
    record, pane = _helps_in(tmux, 80, tmp_path, {"NO_COLOR": "1"})
    assert record["isatty"], "NO_COLOR was checked outside a terminal"
    assert not [h["path"] for h in record["helps"] if "\x1b" in h["text"]], "an escape sequence with NO_COLOR=1"
    assert "\x1b" not in pane.escaped, "the terminal holds coloured or styled text with NO_COLOR=1"
    piped = tmp_path / "piped.json"
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    proc = subprocess.run([sys.executable, "-m", "tests.terminal_helps", str(piped)], cwd=ROOT, timeout=120,
                          env={**env, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}, capture_output=True,
                          text=True, check=True)
    assert not json.loads(piped.read_text())["isatty"]
    assert "\x1b" not in proc.stdout and "\x1b" not in proc.stderr, "an escape sequence written to a pipe"


@pytest.mark.parametrize("columns", WIDTHS)
def test_up_progress_fits_the_terminal_and_loses_nothing(tmux, columns):
    """A recorded `up` re-printed through the kit's printing functions in a terminal: the kit wrapped every long line
    itself (the terminal wrapped no row) and every character of the recording is there (whitespace aside; a table's
    rule of dashes follows the width)."""
    pane = tmux.run([sys.executable, "scripts/replay_up.py"], columns)
    assert pane.rows == pane.joined, f"the terminal wrapped a row: {_first_difference(pane.rows, pane.joined)}"
    assert _ink(pane.rows) == _ink(RECORDED.read_text().splitlines())
    finding = next(n for n, row in enumerate(pane.rows) if "run watcher: 88.5%" in row)
    under = pane.rows[finding + 1]
    assert under.startswith(" " * 11) and under[11] != " ", "the watcher's finding goes on under its timestamp"


@pytest.mark.parametrize("columns", WIDTHS)
def test_plan_fits_the_terminal_and_keeps_every_source(tmux, tmp_path, columns):
    """`plan` of the embedded default in a terminal: no row wider than it, none the terminal had to wrap, and every
    what-if knob's source still there (under the table where the table's other columns leave it no room); to a pipe
    every line stays whole."""
    pane = tmux.run([sys.executable, "-m", "grpo_deploy.cli", "plan"], columns, {"HOME": str(tmp_path)})
    assert max(len(row) for row in pane.rows) <= columns and pane.rows == pane.joined, \
        f"the terminal wrapped a row: {_first_difference(pane.rows, pane.joined)}"
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    as_json = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "plan", "--json"], capture_output=True,
                             text=True, cwd=tmp_path, env=env)
    what_if = json.loads(as_json.stdout)["forecast"]["what_if"]
    assert what_if and all(_ink([w["source"]]) in _ink(pane.rows) for w in what_if)
    for w in what_if:  # each knob's row of the table is one row: knob, change, factor, training and wall together
        row = next(r for r in pane.rows if r.startswith(w["knob"]))
        assert f"{w['current']} -> {w['proposed']}" in row and f"x{w['factor']:g} " in row, row
    header = next(n for n, r in enumerate(pane.rows) if r.startswith("knob "))
    assert set(pane.rows[header + 1]) == {"-", " "}, pane.rows[header:header + 2]  # the header is one row: its rule
    piped = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "plan"], capture_output=True, text=True,
                           cwd=tmp_path, env=env)
    assert any(len(line) > 120 for line in piped.stdout.splitlines())  # the disk line, whole: grep-able


def test_up_progress_to_a_pipe_is_one_event_a_line():
    """To a pipe (a log file, CI) the replay is the recording, byte for byte: no line wrapped, so grep finds it."""
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    proc = subprocess.run([sys.executable, "scripts/replay_up.py"], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout == RECORDED.read_text()


def _ink(lines: list[str]) -> str:
    """The printed characters of *lines*, whitespace and rules of dashes left out."""
    return "".join("".join(line.split()) for line in lines if not re.fullmatch(r"[- ]*", line))


def _first_difference(got: list[str], want: list[str]) -> str:
    for n, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"row {n}: shown {a!r}, written {b!r}"
    return f"{len(got)} rows shown, {len(want)} written"


def test_every_module_that_writes_an_escape_asks_term_first():
    """A module of the kit with an escape sequence in its source (ESC, CSI) asks common.term.escapes_ok before it
    writes one; common/shown.py only matches escapes, to remove them."""
    escape = re.compile(r"\\x1b|\\033|\\u001b|\\x9b|\\e\[|chr\(27\)")
    writers = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in (ROOT / "grpo_deploy").rglob("*.py")}
    writers = {name: text for name, text in writers.items() if escape.search(text)}
    assert {"grpo_deploy/cli.py", "grpo_deploy/image_build/progress.py"} <= set(writers), sorted(writers)
    unchecked = [name for name, text in writers.items()
                 if name != "grpo_deploy/common/shown.py" and "escapes_ok(" not in text]
    assert not unchecked, f"escape sequences written without common.term.escapes_ok: {unchecked}"
