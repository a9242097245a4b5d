"""The trainer's disk watchdog: before each save, the run stops cleanly (no save started, the newest complete
checkpoint kept) when the free space where checkpoints go is under the next checkpoint plus the margin — instead of
a disk that fills mid-save and leaves a half-written checkpoint (the A100 field run lost its step-80 save that way)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from transformers import TrainerCallback

from grpo_deploy.runtime.storage.disk_space import DiskWatchdogConfig, Verdict, free_bytes, judge
from grpo_deploy.runtime.trainer.processes import agree

log = logging.getLogger("grpo_deploy.disk_watchdog")


class DiskWatchdog(TrainerCallback):
    """On a step that will save, judge first; when the save cannot fit, cancel it and stop training."""

    def __init__(self, output_dir: str, config: DiskWatchdogConfig, emit: Callable[..., dict],
                 free: Callable[[str], int] = free_bytes):
        self.output_dir, self.config, self.emit, self.free = output_dir, config, emit, free
        self.tripped: Verdict | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        """One `disk_watchdog_armed` event: the estimate and margin it judges with, and the free space at the start."""
        if state.is_world_process_zero:
            self.emit("disk_watchdog_armed", checkpoint_bytes=self.config.checkpoint_bytes,
                      margin_bytes=self.config.margin_bytes, free_bytes=self.free(self.output_dir))
        return control

    def on_step_end(self, args, state, control, **kwargs):
        """Rank 0 judges; every rank of a trainer of several processes stops with it (processes.agree), or the
        others would wait for it in the next collective."""
        if not control.should_save:
            return control
        verdict = judge(self.output_dir, self.config, self.free) if state.is_world_process_zero else None
        if agree(verdict is not None and not verdict.fits):
            control.should_save = False
            control.should_training_stop = True
            if verdict is not None:
                self.tripped = verdict
                log.error(verdict.message)
                self.emit("disk_watchdog_stop", step=state.global_step, free_bytes=verdict.free_bytes,
                          need_bytes=verdict.need_bytes, message=verdict.message)
        return control
