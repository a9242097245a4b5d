"""The trainer's own TRL callbacks: every log record into the metrics file as a `step` event, the share checked before
a save, and the run watcher on each logged step (its stop: save, then end training)."""

from __future__ import annotations

from transformers import TrainerCallback

from grpo_deploy.common.metrics import MetricsSink
from grpo_deploy.runtime.trainer.processes import agree

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


class WatcherCallback(TrainerCallback):
    """The run watcher (run_watch.RunWatch, rank 0 only: None elsewhere) on every logged step. When it asks for a
    stop, every rank ends training at the next step's end (processes.agree), with a save when the run saves
    checkpoints — judged by the disk watchdog and the share guard after this callback, which is why it comes first."""

    def __init__(self, watch):
        self.watch = watch
        self.stopped_at: int | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.watch is not None and state.is_world_process_zero and logs and "train_runtime" not in logs:
            self.watch.step(state.global_step, logs)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.watch is not None:
            self.watch.poll(state.global_step)  # the served-policy check's reports, from its own thread
        if self.stopped_at is None and agree(self.watch is not None and self.watch.stop is not None):
            self.stopped_at = state.global_step
            control.should_training_stop = True
            control.should_save = control.should_save or args.save_strategy != "no"
        return control
