"""Tests of grpo_deploy.deploy.lifecycle (a run brought up and down on its hosts): `down` refuses a run folder whose
render is a link, in one line, writing nothing through it."""

from __future__ import annotations

import pytest

from grpo_deploy.deploy import lifecycle
from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.hosts.connect import SshOptions
from grpo_deploy.spec import loads, new_spec
from grpo_deploy.spec.resolve import resolve


def _res():
    return resolve(loads(new_spec.spec_text("cpu", "trl-async", [], "r1")))


def test_down_refuses_a_run_folder_render_that_is_a_link_in_one_line(tmp_path, monkeypatch):
    """`down` from a folder whose run render is a symlink: nothing is written through it, and the one line says so."""
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine").write_text("the user's\n")
    run_dir = tmp_path / ".grpo-deploy" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "render").symlink_to(elsewhere)
    with pytest.raises(LaunchError) as caught:
        lifecycle.down(_res(), SshOptions())
    line = str(caught.value)
    assert "\n" not in line and "not stopped on 1 host(s): host local" in line and "symbolic link" in line
    assert sorted(p.name for p in elsewhere.iterdir()) == ["mine"]



def test_ups_progress_lines_are_printed_without_control_characters():
    import io

    out = io.StringIO()
    lifecycle.up_log(out)("step 3/40\x1b[2J  reward 0.5\x1b]0;title\x07\u202e")
    assert out.getvalue().endswith("] step 3/40  reward 0.5\n") and "\x1b" not in out.getvalue()


def test_ups_progress_wraps_under_the_timestamp_on_a_terminal_and_stays_one_line_in_a_file(tmp_path, monkeypatch):
    """A real pseudo-terminal 80 columns wide gets the long line wrapped under its timestamp; a file gets it whole."""
    import fcntl
    import os
    import struct
    import termios

    monkeypatch.delenv("COLUMNS", raising=False)
    finding = ("run watcher: 88.5% of answers hit the 24-token length cap over the last 1 logged steps (bound 20%; "
               "mean length 23.4): raise max_completion_length, or use a per-token loss (packing) so long answers "
               "stop growing")
    main, side = os.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with open(side, "w") as tty:
        lifecycle.up_log(tty, clock=lambda: "14:02:07")(finding)
    shown = os.read(main, 4096).decode().replace("\r\n", "\n")
    os.close(main)
    lines = shown.splitlines()
    assert len(lines) == 4 and all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("[14:02:07] run watcher:") and all(line.startswith(" " * 11) for line in lines[1:])
    with open(tmp_path / "up.log", "w") as log:
        lifecycle.up_log(log, clock=lambda: "14:02:07")(finding)
    assert (tmp_path / "up.log").read_text() == f"[14:02:07] {finding}\n"
