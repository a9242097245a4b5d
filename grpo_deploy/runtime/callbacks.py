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
