"""Hostile `grpo-deploy tune` flags: a budget of 0, -1, 1e9 or `$x`, a target outside the rewards' 0..1, a knob the
engine does not have, a step count too small, --apply without a spec file, a budget that cannot hold the baselines:
each refused in one line, exit 2, no traceback, nothing started and nothing written (no tune folder)."""

from __future__ import annotations

import pytest

from tests.hostile.helpers import assert_refused, cli


def _nothing_written(tmp_path) -> None:
    assert not (tmp_path / ".grpo-deploy").exists(), sorted(p.name for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(("flag", "words"), [
    (["--budget", "0"], ("--budget", "minutes from 1 to 10080")),
    (["--budget", "-1"], ("--budget",)),
    (["--budget", "1e9"], ("--budget", "minutes from 1 to 10080")),
    (["--budget", "10081"], ("--budget", "minutes from 1 to 10080")),
    (["--budget", "$x"], ("--budget", "minutes from 1 to 10080")),
    (["--budget", "nan"], ("--budget",)),
    (["--budget", "30\n"], ("--budget",)),
    (["--target", "0"], ("--target", "above 0 and at most 1")),
    (["--target", "1.5"], ("--target", "above 0 and at most 1")),
    (["--target", "-0.2"], ("--target",)),
    (["--target", "inf"], ("--target", "above 0 and at most 1")),
    (["--target", "$x"], ("--target", "above 0 and at most 1")),
    (["--steps", "5"], ("--steps", "from 6 to 10000")),
    (["--steps", "-3"], ("--steps",)),
    (["--steps", "99999999"], ("--steps", "from 6 to 10000")),
    (["--knobs", "a;id"], ("--knobs", "comma-separated list of knob names")),
    (["--knobs", ","], ("--knobs", "comma-separated list of knob names")),
    (["--knobs", "-x"], ("--knobs",)),
])
def test_a_bad_flag_is_one_line_and_starts_nothing(tmp_path, flag, words):
    run = cli(["tune", *flag], tmp_path)
    assert run.code == 2 and "Traceback" not in run.err, (run.code, run.err)
    assert all(w in run.err for w in words), run.err
    _nothing_written(tmp_path)


def test_a_knob_the_engine_does_not_have_is_named_with_the_engines_knobs(tmp_path):
    run = cli(["tune", "--knobs", "packin"], tmp_path)
    assert_refused(run, words=("--knobs", "'packin' is not a knob of engine trl-async", "did you mean 'packing'"))
    _nothing_written(tmp_path)


def test_apply_without_a_spec_file_is_refused(tmp_path):
    run = cli(["tune", "--apply"], tmp_path)
    assert_refused(run, words=("--apply needs a spec file",))
    _nothing_written(tmp_path)


def test_a_budget_that_cannot_hold_the_baselines_says_how_much_would(tmp_path):
    run = cli(["tune", "--budget", "1"], tmp_path)
    assert_refused(run, words=("--budget 1:", "raise --budget to"))
    _nothing_written(tmp_path)
