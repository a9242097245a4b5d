"""The trainer's own TRL callbacks (runtime/trainer/callbacks.py) on real transformers TrainerState/TrainerControl/
TrainingArguments: every log record into the metrics file (the end-of-training summary apart), the share checked
before a save only, and the run watcher's stop at the next step's end (with a save where the run saves)."""

from __future__ import annotations

import math

import pytest

from grpo_deploy.common.metrics import MetricsSink, read_events
from grpo_deploy.runtime.trainer.callbacks import ShareGuardCallback, WatcherCallback
from grpo_deploy.runtime.watch.run_watch import RunWatch
from tests.unit.runtime.watch.test_run_watch import config


def test_callback_writes_steps_and_summary(tmp_path):
    transformers = pytest.importorskip("transformers")
    from grpo_deploy.runtime.trainer.callbacks import MetricsCallback

    sink = MetricsSink(str(tmp_path / "m.jsonl"))
    callback = MetricsCallback(sink)
    state = transformers.TrainerState()
    state.global_step = 7
    callback.on_log(None, state, None, logs={"reward": 0.5, "sample/staleness_mean": 1.0, "ratio": math.nan})
    callback.on_log(None, state, None, logs={"train_runtime": 3.0, "train_loss": 0.1})
    sink.close()
    step, summary = read_events(str(tmp_path / "m.jsonl"))
    assert step["event"] == "step" and step["step"] == 7 and step["reward"] == 0.5 and step["ratio"] is None
    assert step["sample/staleness_mean"] == 1.0
    assert summary["event"] == "train_summary" and summary["train_runtime"] == 3.0


def test_the_share_is_checked_before_a_save_and_only_then(tmp_path):
    from transformers import TrainerControl

    args, state, _ = _trl(tmp_path)
    checked = []
    callback = ShareGuardCallback(lambda: checked.append(state.global_step))
    for n, saves in ((1, False), (2, True), (3, False)):
        state.global_step = n
        control = TrainerControl(should_save=saves)
        assert callback.on_step_end(args, state, control) is control
    assert checked == [2]

    def gone():
        raise OSError("the shared volume is gone")

    with pytest.raises(OSError, match="gone"):
        ShareGuardCallback(gone).on_step_end(args, state, TrainerControl(should_save=True))


def _trl(tmp_path, save_strategy="steps"):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), save_strategy=save_strategy, save_steps=100, use_cpu=True,
                             report_to=[])
    return args, TrainerState(), TrainerControl()


def test_the_trl_callback_stops_at_the_next_step_end_with_a_save(tmp_path):
    args, state, control = _trl(tmp_path)
    callback = WatcherCallback(RunWatch(config(), lambda *a, **k: {}))
    for n in range(1, 20):
        state.global_step = n
        callback.on_step_end(args, state, control)
        if control.should_training_stop:
            break
        callback.on_log(args, state, control, logs={"reward": 0.5, "loss": 0.1})
    assert callback.stopped_at == callback.watch.stop.step + 1  # the step after the log that asked for it
    assert control.should_save and control.should_training_stop


def test_a_served_policy_finding_stops_the_trl_run_at_that_steps_end_without_a_logged_step(tmp_path):
    args, state, control = _trl(tmp_path)
    watch = RunWatch(config(min_gain=0.001), lambda *a, **k: {})
    callback = WatcherCallback(watch)
    state.global_step = 3
    callback.on_step_end(args, state, control)
    assert not control.should_training_stop
    watch.report({"adapter": "trl-policy-v3", "verdict": "not-listed", "listed": False, "clear": False})
    state.global_step = 4
    callback.on_step_end(args, state, control)
    assert callback.stopped_at == 4 and control.should_training_stop and control.should_save
    assert watch.stop.kind == "stale_policy"


def test_the_trl_callback_does_not_add_a_save_to_a_run_that_never_saves(tmp_path):
    args, state, control = _trl(tmp_path, save_strategy="no")
    callback = WatcherCallback(RunWatch(config(), lambda *a, **k: {}))
    for n in range(1, 20):
        state.global_step = n
        callback.on_log(args, state, control, logs={"reward": 0.5})
        callback.on_step_end(args, state, control)
    assert control.should_training_stop and not control.should_save


def test_the_trl_callback_of_a_rank_above_0_watches_nothing_and_never_stops_alone(tmp_path):
    args, state, control = _trl(tmp_path)
    callback = WatcherCallback(None)
    for n in range(1, 20):
        state.global_step = n
        callback.on_log(args, state, control, logs={"reward": 0.5})
        callback.on_step_end(args, state, control)
    assert callback.stopped_at is None and not control.should_training_stop
