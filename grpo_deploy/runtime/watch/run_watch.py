"""The run watcher inside a running trainer, for either engine: its warm start from the run's metrics file, each
finding as a `watch` event and a log line, the stop it asks for, and its state at the run's end (watch/watcher.py
judges; this module only connects it to the run)."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from grpo_deploy.common.metrics import read_events
from grpo_deploy.common.readback import ReadRefused
from grpo_deploy.runtime.watch.config import WatchConfig
from grpo_deploy.runtime.watch.watcher import Finding, Watcher

log = logging.getLogger("grpo_deploy.watch")

STOPPED_EARLY = "stopped-early"
"""run_end's status when the watcher stopped the run (exit 0: the run ended as its spec asked; `up` does not restart
it)."""


def history(events: Iterable[dict]) -> list[dict]:
    """The events the watcher warms up on: the run's, from the last watcher stop on. A resume after such a stop is the
    user's choice to go on, so the steps after it are judged afresh (a plateau needs a window again, then patience)."""
    events = list(events)
    stops = [i for i, e in enumerate(events) if e.get("event") == "run_end" and e.get("status") == STOPPED_EARLY]
    return events[stops[-1] + 1:] if stops else events


def read_history(metrics_path: str) -> list[dict]:
    """history() of the metrics file at *metrics_path* (read bounded); [] when there is none yet or it cannot be read
    back (the watcher then starts cold: it is advice, not a reason to stop a run)."""
    try:
        return history(read_events(metrics_path))
    except ReadRefused as refused:
        if refused.kind != "missing":
            log.warning(f"run watcher: starting cold, the metrics file is not read back: {refused}")
        return []
    except OSError as error:
        log.warning(f"run watcher: starting cold, the metrics file is not read back: {error}")
        return []


class RunWatch:
    """A Watcher fed the run's logged steps: findings become `watch` events (and warnings in the log), `stop` is the
    finding that asks the run to save and stop, `end_fields()` what run_end keeps."""

    def __init__(self, config: WatchConfig, emit: Callable[..., dict], past: Iterable[dict] = ()):
        self.config, self.emit = config, emit
        self.watcher = Watcher(config)
        self.watcher.replay(past)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # reports of other threads (the served-policy check)
        knobs = config.settings.model_dump(mode="json")
        emit("watch_armed", objective=config.objective, total_steps=config.total_steps, gpus=config.gpus, **knobs)

    def step(self, step: int, metrics: Mapping[str, Any], now: float | None = None) -> Finding | None:
        """Observe one logged step; returns the stop finding once the watcher asks for a stop (None before)."""
        self.poll(step)
        self._announce(self.watcher.observe(step, metrics, time.time() if now is None else now))
        return self.watcher.stop

    def report(self, values: Mapping[str, Any]) -> None:
        """A served-policy check's report, from its own thread: judged on the training thread at the next poll()."""
        self.inbox.put(dict(values))

    def poll(self, step: int) -> Finding | None:
        """Judge the reports that arrived since the last poll at *step* (the trainer calls this at each step's end, so a
        stop does not wait for a logged step); returns the stop finding once there is one."""
        while True:
            try:
                values = self.inbox.get_nowait()
            except queue.Empty:
                return self.watcher.stop
            self._announce(self.watcher.served_policy(step, values))

    def _announce(self, findings: list[Finding]) -> None:
        for finding in findings:
            values = {k: v for k, v in finding.values.items() if k not in ("kind", "level", "step", "message")}
            self.emit("watch", kind=finding.kind, level=finding.level, step=finding.step, message=finding.message,
                      **values)
            (log.info if finding.level == "clear" else log.warning)(f"run watcher: {finding.message}")

    @property
    def stop(self) -> Finding | None:
        return self.watcher.stop

    def summary(self) -> None:
        """One `watch_summary` event with the watcher's state (status and summary.json read it)."""
        self.emit("watch_summary", **{k: v for k, v in self.watcher.state().items() if k not in ("event", "time")})
