"""tune/session.py's checks before the first trial: an unknown knob (with the engine's knobs named), --apply without
a spec file, a budget that cannot hold the baselines and one knob trial by the forecast (with the budget that would),
and what a budget that fits says."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_deploy.spec.resolve import resolve
from grpo_deploy.tune import loop, session
from tests.specs import loaded


@pytest.fixture(scope="module")
def cpu_res():
    return resolve(loaded("cpu", "trl-async", ()))


def _request(budget_min: float = 30, knobs=None, steps: int = 12) -> loop.TuneRequest:
    return loop.TuneRequest(budget_min * 60, None, knobs, steps)


def test_an_unknown_knob_names_the_engines_knobs(cpu_res):
    with pytest.raises(session.TuneRefused, match=r"'packin' is not a knob of engine trl-async; did you mean "
                                                  r"'packing'\?; its knobs: .*inflight"):
        session.check_start(cpu_res, _request(knobs=("packin",)), None, False)


def test_apply_needs_a_spec_file(cpu_res):
    with pytest.raises(session.TuneRefused, match="--apply needs a spec file"):
        session.check_start(cpu_res, _request(), None, True)


def test_a_budget_too_small_for_the_baselines_says_the_budget_that_would_hold_them(cpu_res):
    with pytest.raises(session.TuneRefused) as refused:
        session.check_start(cpu_res, _request(budget_min=2), None, False)
    text = str(refused.value)
    need = int(text.split("raise --budget to ")[1].split(" ")[0])
    start = session.check_start(cpu_res, _request(budget_min=need + 1), None, False)
    assert start.knob_trials >= 1 and (loop.MIN_BASELINES + start.knob_trials) * start.trial_s <= (need + 1) * 60


def test_a_budget_that_fits_counts_the_knob_trials_from_the_forecast(cpu_res):
    start = session.check_start(cpu_res, _request(budget_min=30), Path("s.yaml"), True)
    ref = cpu_res.profiles["local"].reference["trl-async"]
    assert start.trial_s == pytest.approx(ref["startup_s"].value + 12 * ref["step_s"].value + loop.TEARDOWN_S)
    assert start.knob_trials == int(30 * 60 // start.trial_s) - loop.MIN_BASELINES
