"""Trainer callback that copies every TRL log record into the metrics file as a `step` event."""

from __future__ import annotations

from transformers import TrainerCallback

from .metrics import MetricsSink

SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")


class MetricsCallback(TrainerCallback):
    """`on_log` -> `{"event": "step", "step": N, <every key TRL logged, verbatim>}` (main process only).

    The end-of-training summary that transformers logs (train_runtime, train_loss, ...) becomes `train_summary`.
    """

    def __init__(self, sink: MetricsSink):
        self.sink = sink

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        event = "train_summary" if any(key in logs for key in SUMMARY_KEYS) else "step"
        self.sink.emit(event, step=state.global_step, **logs)


class ShareGuardCallback(TrainerCallback):
    """Before a step's checkpoint save, `check()` the run directory on the shared volume (storage_faults.ShareGuard):
    a share that is gone stops the run with its message instead of a save into the wrong place."""

    def __init__(self, check):
        self.check = check

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save:
            self.check()
        return control
