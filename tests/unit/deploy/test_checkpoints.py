"""Tests of grpo_deploy.deploy.checkpoints: the manager's answers as the CLI prints them (the manager itself is tested
in tests/unit/runtime/storage/test_checkpoints.py, and run in the real image in tests/integration/test_rehearsal.py)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from grpo_deploy import preflight, spec
from grpo_deploy.cli import main
from grpo_deploy.deploy import checkpoints
from grpo_deploy.runtime.storage import checkpoints as manager
from grpo_deploy.spec import resolve
from tests.unit.runtime.storage.test_checkpoints import verl_checkpoint


def _answer(directory, action="list", **kw) -> dict:
    """What `python3 -m grpo_deploy.runtime.storage.checkpoints` prints, as run_manager hands it on."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = manager._main([action, str(directory), *kw.get("args", [])])
    return {**json.loads(out.getvalue()), "host": "spark1", "exit_code": code}


def test_listing_names_each_state_and_the_tracker(tmp_path):
    verl_checkpoint(tmp_path, 20)
    verl_checkpoint(tmp_path, 40)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("20")
    text = checkpoints.listing_text(_answer(tmp_path))
    assert text.splitlines()[0] == f"verl checkpoints in spark1:{tmp_path} (verl tracker: step 20)"
    row20 = next(line for line in text.splitlines() if line.split()[:2] == ["20", "complete"])
    row40 = next(line for line in text.splitlines() if line.split()[:2] == ["40", "half-written"])
    assert row20.split()[4:6] == ["8", "2"] and "newer than the tracker" in row40
    assert text.splitlines()[-1].startswith("2 checkpoint(s), ")


def test_listing_of_an_empty_directory(tmp_path):
    assert checkpoints.listing_text(_answer(tmp_path)).endswith(": none yet")


def test_prune_text_says_what_went_and_what_was_quarantined(tmp_path):
    for step in (20, 40, 60):
        verl_checkpoint(tmp_path, step)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("40")
    dry = checkpoints.prune_text(_answer(tmp_path, "prune", args=["--keep", "1", "--dry-run"]))
    assert dry.splitlines()[0].startswith("would remove: 20 (") and "would quarantine half-written" in dry
    assert (tmp_path / "global_step_20").exists()
    done = checkpoints.prune_text(_answer(tmp_path, "prune", args=["--keep", "1"]))
    assert done.splitlines()[:2][1] == "kept (complete): 40" and "quarantined half-written" in done
    assert [asdict(c)["step"] for c in manager.list_checkpoints(str(tmp_path))] == [40]


VERL_LOCAL = ("engine: verl\nhosts: [{name: box, profile: a100, roles: [head]}]\n"
              "images: {verl: grpo-deploy/not-built-anywhere:0}\n")


def test_a_verl_spec_runs_the_manager_in_the_verl_image_or_says_in_one_line_why_not():
    """The head runs the verl image (the engine says so): with that image absent, one line naming it, no KeyError."""
    res = resolve.resolve(spec.loads(VERL_LOCAL))
    ctx = preflight.Context(res)
    try:
        with pytest.raises(checkpoints.CheckpointsError) as exc:
            checkpoints.run_manager(res, ctx, "list")
    finally:
        ctx.close()
    message = str(exc.value)
    assert "\n" not in message and message.startswith("box: ")
    assert "grpo-deploy/not-built-anywhere:0 is not there" in message or "Docker engine unreachable" in message


def test_the_checkpoints_verb_on_a_verl_spec_answers_in_one_line(tmp_path, capsys):
    path = tmp_path / "verl.yaml"
    path.write_text(VERL_LOCAL)
    assert main(["checkpoints", "list", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: box: ") and "Traceback" not in err
