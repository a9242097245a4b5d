"""One tuning trial: the user's spec changed by one knob (or none: a baseline), under a run name of its own, brought up
by `grpo-deploy up` in a scratch folder of its own on the spec's own hosts, followed to its end, and measured from
the trainer's own step events (tune.decide.Trial). Trials never save a checkpoint and never touch the user's run."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.common.readback import ReadRefused, read_text
from grpo_deploy.diagnose.base import step_events
from grpo_deploy.names import STATE_DIR
from grpo_deploy.spec.load import loads
from grpo_deploy.spec.resolve import Resolved, resolve
from grpo_deploy.spec.schema import SpecError
from grpo_deploy.tune.decide import Trial
from grpo_deploy.tune.knobs import apply_knob

METRICS_MAX_BYTES = 64 << 20  # a trial's metrics.jsonl, read back bounded
NO_SAVE = 1_000_000  # checkpoints.save_every for a trial: past its last step, so it never saves
STEP_LINE = re.compile(r"step (\d+)/(\d+)")


@dataclass(frozen=True)
class TrialPlan:
    """What one trial runs: the label, the knob (None: a baseline) and the changes to the user's spec."""

    label: str
    knob: str | None = None
    value: Any = None
    changes: tuple[tuple[str, Any], ...] = ()  # (setting, value): the kept knobs, then this trial's own
    objective: str = ""


def trial_data(user: dict, res: Resolved, plan: TrialPlan, run_name: str, steps: int) -> dict:
    """The user's spec data with *plan*'s changes, renamed to *run_name*, *steps* long, saving never, resuming
    never (a pure function: the user's data is not changed)."""
    data = copy.deepcopy(user)
    for setting, value in plan.changes:
        data = apply_knob(data, setting, value)
    data.setdefault("run", {})["name"] = run_name
    checkpoints = data.setdefault("checkpoints", {}) or {}
    data["checkpoints"] = {**checkpoints, "save_every": NO_SAVE, "resume": "never"}
    return apply_knob(data, res.engine_info.steps_setting, steps)


def check_trial(data: dict, source: str) -> Resolved:
    """The trial's spec validated and resolved as `up` will (a refused config raises SpecError)."""
    return resolve(loads(yaml.safe_dump(data, sort_keys=False), source=source))


def measure(plan: TrialPlan, res: Resolved, events: list[dict], ok: bool, reason: str) -> Trial:
    """A Trial from the trial run's events: steps, wall time first step -> last, samples trained, the reward per step
    with the time since the first step, and what is shown beside the verdict (tokens per second, peak memory)."""
    steps = step_events(events)
    reward_key = res.engine_info.watch_keys.get("reward") or "reward"
    if not steps:
        return Trial(plan.label, plan.knob, plan.value, False, reason or "no optimizer step was logged",
                     objective=plan.objective)
    t0 = float(steps[0]["time"])
    rewards = tuple((int(s["step"]), round(float(s["time"]) - t0, 3), float(s[reward_key]))
                    for s in steps if isinstance(s.get(reward_key), int | float) and isinstance(s.get("step"), int))
    samples = sum(res.engine_info.samples_in_step(res, s) or 0 for s in steps[1:])
    extra = {key: _median([float(s[name]) for s in steps if isinstance(s.get(name), int | float)])
             for key, name in res.engine_info.tune_figures.items()}
    wall = float(steps[-1]["time"]) - t0
    sustained = _sustained_step(events, res)
    if sustained is not None and len(steps) > 1:  # a short trial fed by its start-up queue reads too fast
        extra.update(fed_by_startup_backlog=True, wall_s_measured=round(wall, 3), sustained_step_s=sustained)
        wall = max(wall, sustained * (len(steps) - 1))
    return Trial(plan.label, plan.knob, plan.value, ok, reason, steps=len(steps) - 1, wall_s=round(wall, 3),
                 samples=int(samples), rewards=rewards, objective=plan.objective,
                 extra={k: v for k, v in extra.items() if v is not None})


def _sustained_step(events: list[dict], res: Resolved) -> float | None:
    """The step time generation sustains where the engine's diagnosis finds the steps fed by the rollouts queued while
    the trainer started (trl-async: diagnose's `fed_by_startup_backlog`); None otherwise."""
    try:
        evidence = res.engine_info.diagnose(events, res)[0].evidence
    except Exception:  # noqa: BLE001 - an engine without a diagnosis, or too few steps: the trial reads as measured
        return None
    if evidence.get("fed_by_startup_backlog") and isinstance(evidence.get("sustained_step_s"), int | float):
        return float(evidence["sustained_step_s"])
    return None


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def run_trial(plan: TrialPlan, data: dict, res: Resolved, folder: Path, ssh_args: list[str],
              progress: Callable[[int, int], None] | None = None,
              timeout_s: float = 3600) -> tuple[Trial, list[dict]]:
    """`grpo-deploy up --fresh --scratch` of the trial's spec in *folder* (a subprocess: its state, its log; the
    trial's run folder on the share is scratch, so a previous tune's folder of that name is removed, not moved aside
    as a user's run is: repeated tunes do not pile folders up on the share), its progress
    lines to *folder*/up.log, then its metrics read back. Ctrl-C stops the trial as `up` stops any run (what it
    started is removed) and is raised again once it has. Returns the Trial and the run's events (for diagnose)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "trial.yaml"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    log_path = folder / "up.log"
    command = [sys.executable, "-m", "grpo_deploy.cli", "up", "-f", str(spec_path.resolve()), "--fresh", "--scratch",
               *ssh_args]
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "NO_COLOR": "1"})
        deadline = time.monotonic() + timeout_s
        try:
            for line in proc.stdout:
                log.write(line)
                m = STEP_LINE.search(line)
                if m and progress:
                    progress(int(m.group(1)), int(m.group(2)))
                if time.monotonic() > deadline:
                    proc.send_signal(signal.SIGINT)
                    break
            code = proc.wait(timeout=300)
        except KeyboardInterrupt:
            proc.wait(timeout=300)  # `up` got the same Ctrl-C: let it stop what it started
            raise
    said = log_path.read_text(errors="replace")
    metrics = folder / STATE_DIR / res.spec.run.name / "metrics.jsonl"
    reason = "" if code == 0 else _failure(said, code)
    try:
        events = parse_events(read_text(metrics, METRICS_MAX_BYTES, "the trial's metrics"))
    except ReadRefused as exc:
        events, reason = [], reason or f"its metrics were not read back: {exc}"
    return measure(plan, res, events, code == 0 and not reason, reason), events


def _failure(said: str, code: int) -> str:
    """One line on why a trial's `up` failed: its `error:` line, or an out-of-memory sign, or its exit status."""
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error:"):
            detail = f" {lines[i + 1]}" if lines[i].endswith(":") and i + 1 < len(lines) else ""
            return (lines[i] + detail)[:300]
    if any("out of memory" in ln.lower() or "outofmemory" in ln.lower() for ln in lines):
        return "out of memory (see the trial's up.log)"
    return f"`up` exited with {code} (see the trial's up.log)"


__all__ = ["TrialPlan", "trial_data", "check_trial", "measure", "run_trial", "SpecError"]
