"""The trainer's disk watchdog (runtime/trainer/disk_watchdog.py): the callback cancels the save and stops training on
real transformers TrainerControl/TrainerState objects, and announces its estimate at the start. The verdict it acts on:
storage/test_disk_space.py."""

from __future__ import annotations

from transformers import TrainerControl, TrainerState

from grpo_deploy.runtime.storage.disk_space import DiskWatchdogConfig
from grpo_deploy.runtime.trainer.disk_watchdog import DiskWatchdog

MB = 10**6


def test_the_callback_cancels_the_save_and_stops(tmp_path):
    events = []
    watchdog = DiskWatchdog(str(tmp_path), DiskWatchdogConfig(checkpoint_bytes=2 * MB), lambda e, **f: events.append(
        (e, f)), free=lambda _: MB)
    state = TrainerState(global_step=8)
    quiet = watchdog.on_step_end(None, state, TrainerControl(should_save=False))
    assert not quiet.should_training_stop and watchdog.tripped is None  # no save this step: nothing judged
    control = watchdog.on_step_end(None, state, TrainerControl(should_save=True))
    assert control.should_save is False and control.should_training_stop is True
    assert events[0][0] == "disk_watchdog_stop" and events[0][1]["step"] == 8 and watchdog.tripped is not None


def test_the_watchdog_announces_its_estimate_at_the_start(tmp_path):
    events = []
    watchdog = DiskWatchdog(str(tmp_path), DiskWatchdogConfig(checkpoint_bytes=543_000, margin_bytes=7),
                            lambda e, **f: events.append((e, f)), free=lambda _: 2_000_000)
    watchdog.on_train_begin(None, TrainerState(), TrainerControl())
    assert events == [("disk_watchdog_armed", {"checkpoint_bytes": 543_000, "margin_bytes": 7,
                                               "free_bytes": 2_000_000})]
