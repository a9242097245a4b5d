"""grpo_deploy.image_build.progress: one line per step, the full output in a log, the log's tail on failure."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from grpo_deploy.image_build import progress


def test_a_step_off_a_terminal_prints_a_start_and_an_end_line_and_logs_everything(tmp_path: Path):
    out, log = io.StringIO(), tmp_path / "logs" / "step.log"
    with progress.Step("wheelhouse cpu", log, out) as step:
        step.write([f"pip line {i}\n" for i in range(500)])
        step.update("3/10 wheels", 3, 10)
        step.done("10 wheels")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0] == f"wheelhouse cpu: started (log: {log})" and lines[1].startswith("wheelhouse cpu: 10 wheels (")
    text = log.read_text()
    assert "pip line 0\n" in text and "pip line 499\n" in text and "pip line" not in out.getvalue()


def test_a_failed_step_shows_the_last_lines_of_its_log_and_its_path(tmp_path: Path):
    out, log = io.StringIO(), tmp_path / "step.log"
    with pytest.raises(progress.StepFailed), progress.Step("code image x", log, out) as step:
        step.write("".join(f"build line {i}\n" for i in range(100)))
        raise progress.StepFailed("docker build failed: boom")
    text = out.getvalue()
    assert "build line 99" in text and "build line 79" not in text, "the last lines of the log, not all of it"
    assert text.rstrip().endswith(f"code image x: FAILED after 0 s: docker build failed: boom (full log: {log})")


def test_bar_and_sizes():
    assert progress.bar(0, 10).endswith("  0%") and progress.bar(10, 10).endswith("100%")
    assert progress.bar(5, 10).count("#") == progress.BAR_WIDTH // 2 and progress.bar(20, 10).endswith("100%")
    assert progress.human(999) == "999 B" and progress.human(3.2e9) == "3.2 GB" and progress.human(1500) == "1.5 kB"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_step_is_one_line_rewritten_in_place(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = _Tty()
    with progress.Step("deps image", tmp_path / "l.log", out) as step:
        step._last_draw = -1.0
        step.update("step 2/12", 1, 12)
        step.done("built")
    assert out.getvalue().count("\n") == 1 and out.getvalue().count("\r") >= 3


def test_with_no_color_a_terminal_gets_plain_lines_and_no_escape(tmp_path: Path, monkeypatch):
    """NO_COLOR (any non-empty value) turns the redrawn line off: a start line and an end line, no ESC, no CR."""
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("NO_COLOR", "1")
    out = _Tty()
    with progress.Step("deps image", tmp_path / "l.log", out) as step:
        step._last_draw = -1.0
        step.update("step 2/12", 1, 12)
        step.done("built")
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text, text
    assert text.startswith("deps image: started (log:") and text.endswith("\ndeps image: built (0 s)\n"), text
