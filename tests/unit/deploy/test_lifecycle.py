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
