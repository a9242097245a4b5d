"""tune/trials.py without a run: a trial's spec (the user's data with the knobs, renamed, as long as asked, never
saving or resuming, validated as `up` will), and a Trial measured from a real run's recorded metrics stream."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.spec import new_spec
from grpo_deploy.spec.resolve import resolve
from grpo_deploy.spec.schema import SpecError
from grpo_deploy.tune import trials
from grpo_deploy.tune.trials import TrialPlan
from tests.specs import loaded

METRICS = Path(__file__).resolve().parents[1] / "metrics" / "cpu_rehearsal.jsonl"


@pytest.fixture(scope="module")
def cpu_res():
    return resolve(loaded("cpu", "trl-async", ()))


def _user() -> dict:
    return yaml.safe_load(new_spec.spec_text("cpu", "trl-async", []))


def test_a_trial_is_the_users_spec_with_the_knob_renamed_short_and_never_saving(cpu_res):
    user = _user()
    before = yaml.safe_dump(user)
    plan = TrialPlan("packing=512", "packing", 512, (("overrides.trl.token_budget", 512),))
    data = trials.trial_data(user, cpu_res, plan, "rehearsal-tune-3", 12)
    assert yaml.safe_dump(user) == before  # the user's data is not changed
    res = trials.check_trial(data, "trial")
    assert res.spec.run.name == "rehearsal-tune-3" and res.settings.trl.max_steps == 12
    assert res.settings.trl.token_budget == 512
    assert res.settings.trl.save_steps > 12 and res.spec.checkpoints.resume == "never"


def test_a_value_the_spec_refuses_is_a_spec_error_before_anything_runs(cpu_res):
    plan = TrialPlan("packing=lots", "packing", "lots", (("overrides.trl.token_budget", "lots"),))
    with pytest.raises(SpecError):
        trials.check_trial(trials.trial_data(_user(), cpu_res, plan, "t-1", 12), "trial")


def test_a_trial_measured_from_a_real_runs_metrics(cpu_res):
    events = parse_events(METRICS.read_text())
    steps = [e for e in events if e.get("event") == "step"]
    trial = trials.measure(TrialPlan("baseline 1.1"), cpu_res, events, True, "")
    assert trial.ok and trial.steps == len(steps) - 1
    assert trial.wall_s == pytest.approx(steps[-1]["time"] - steps[0]["time"], abs=1e-3)
    assert trial.samples == sum(int(s["batch/samples_per_step"]) for s in steps[1:])
    assert [r[0] for r in trial.rewards] == [int(s["step"]) for s in steps] and trial.rewards[0][1] == 0.0
    assert trial.samples_per_hour > 0 and "answer_tok_s" in trial.extra


def test_a_run_that_logged_no_step_is_a_failed_trial_with_a_reason(cpu_res):
    trial = trials.measure(TrialPlan("baseline 1.1"), cpu_res, [{"event": "run_start", "time": 1.0}], True, "")
    assert not trial.ok and trial.reason == "no optimizer step was logged"


@pytest.mark.parametrize(("said", "reason"), [
    ("...\nerror: preflight: disk on local is short\n", "error: preflight: disk on local is short"),
    ("torch.OutOfMemoryError: CUDA out of memory\n", "out of memory (see the trial's up.log)"),
    ("nothing useful\n", "`up` exited with 1 (see the trial's up.log)"),
    ("error: the spec is not valid; nothing was written or started:\n  t.yaml:3: run.name: too long\n",
     "error: the spec is not valid; nothing was written or started: t.yaml:3: run.name: too long"),
])
def test_why_a_trial_failed_in_one_line(said, reason):
    assert trials._failure(said, 1) == reason


def test_a_trial_fed_by_its_start_up_queue_is_measured_at_the_step_generation_sustains():
    """One H200's seed-004 run (tests/unit/metrics/h200_one_gpu_seed004.jsonl): 20 steps trained from the rollouts
    queued while the trainer started, 6.98 s a step; generation sustains ~12.7 s. A tune trial this short must not
    credit a knob with the backlog's speed."""
    res = resolve(loaded("h200", "trl-async", ("gpu1",)))
    events = parse_events((METRICS.parent / "h200_one_gpu_seed004.jsonl").read_text())
    trial = trials.measure(TrialPlan("baseline 1.1"), res, events, True, "")
    assert trial.extra["fed_by_startup_backlog"] is True
    assert trial.extra["sustained_step_s"] == pytest.approx(12.7, abs=0.3)
    assert trial.step_s >= trial.extra["sustained_step_s"] - 0.01  # never faster than generation sustains
    assert trial.extra["wall_s_measured"] <= trial.wall_s


def test_a_trial_is_brought_up_fresh_on_a_scratch_folder(cpu_res, tmp_path, monkeypatch):
    """A trial's run folder on the share is scratch: `up --fresh --scratch` removes a previous tune's folder of that
    name instead of moving it aside (a user's `--fresh`), so repeated tunes do not pile folders up on the share."""
    seen = {}

    class Proc:
        stdout = iter(())

        def __init__(self, command, **kwargs):
            seen["command"] = command

        def wait(self, timeout=None):
            return 2

    monkeypatch.setattr(trials.subprocess, "Popen", Proc)
    trials.run_trial(TrialPlan("baseline"), _user(), cpu_res, tmp_path / "t1", [])
    command = seen["command"]
    assert command[3] == "up" and "--fresh" in command and "--scratch" in command
