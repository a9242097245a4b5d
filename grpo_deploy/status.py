"""Run status from events (pure): the trainer's metrics.jsonl plus the deployer's own events -> summary and plot.

Event shapes are the runtime's contract (grpo_deploy.common.metrics): run_start, trainer_ready, step,
adapter_load, adapter_prune, storage_fault, run_end; the deployer adds up_start, images_ready (seconds spent building
images), server_ready, trainer_started, server_view (what the server sees of an adapter it could not read), up_end;
the reader adds lines_skipped (grpo_deploy.common.metrics.SKIPPED: lines it refused, and why).

What a container wrote is input: a figure that is not a finite number is shown as '-', and the text is printed
through grpo_deploy.common.shown.printable (no control character or terminal escape reaches the terminal).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_deploy.common.metrics import SKIPPED
from grpo_deploy.common.shown import printable
from grpo_deploy.runtime.watch.run_watch import STOPPED_EARLY


def one_line(text: object, limit: int = 300) -> str:
    """A message read back from the run's metrics file as one printable line of at most *limit* characters."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in printable(text)).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def finite(value: Any) -> int | float | None:
    """*value* when it is a finite number (not a bool), else None: a figure read from the run's events."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:  # an int past the float's range (a caller's, never a parsed file's: those are bounded)
        return None


def _figure(compute, values: list) -> float | None:
    values = [v for v in values if finite(v) is not None]
    try:
        return finite(round(compute(values), 4)) if values else None
    except (OverflowError, ValueError):  # e.g. 1e308 twice: the mean of what a container wrote is not a figure
        return None


def _mean(values: list) -> float | None:
    return _figure(statistics.fmean, values)


def _median(values: list) -> float | None:
    return _figure(statistics.median, values)


def step_of(event: dict[str, Any], default: int = 0) -> int:
    """The step number of a step event (*default* when it holds none that is a whole number)."""
    step = finite(event.get("step"))
    return int(step) if step is not None and step == int(step) else default


PHASE_PREFIX = "timing_s/"
"""Step events' per-phase timings (verl's)."""
NOT_PHASES = ("timing_s/step", "timing_s/save_checkpoint", "timing_s/testing")
"""Timings that are not a phase of every step: the whole step, a save, a validation."""


@dataclass
class Summary:
    run: str
    state: str  # not-started | starting | running | finished | stopped-early | failed
    steps: int = 0
    max_steps: int | None = None
    reward_first5: float | None = None
    reward_last5: float | None = None
    completion_length_first5: float | None = None
    completion_length_last5: float | None = None
    staleness_mean: float | None = None
    importance_ratio_min: float | None = None
    importance_ratio_max: float | None = None
    step_time_median_s: float | None = None
    adapter_loads_ok: int = 0
    adapter_loads_failed: int = 0
    median_handoff_s: float | None = None
    adapter_file_modes: list[str] = field(default_factory=list)
    server_ready_s: float | None = None
    up_to_first_step_s: float | None = None
    """`up` -> first optimizer step, image building left out (it is images_build_s)."""
    images_build_s: float | None = None
    wall_s: float | None = None
    reward_per_hour: float | None = None
    eta_s: float | None = None
    run_uid: int | None = None
    run_gid: int | None = None
    umask: str | None = None
    error: str | None = None
    fault: str | None = None
    """The shared-volume fault that stopped the trainer (storage_fault event): the path, the identity, the fix."""
    phase_medians_s: dict[str, float] = field(default_factory=dict)
    """Median seconds per step of each phase the engine times (verl's timing_s/gen, old_log_prob, ref,
    update_actor), after the first step (its warm-up)."""
    kl_loss_last5: float | None = None
    grad_norm_last5: float | None = None
    watch: dict[str, Any] | None = None
    """The run watcher's state (grpo_deploy.runtime.watch.watcher.Watcher.state): the reward's trend, a plateau and the
    compute spent after it, answers at the length cap, time to the target reward."""
    watch_findings: list[dict[str, Any]] = field(default_factory=list)
    """What the watcher found that still stands: the latest `watch` event of each kind, unless it cleared."""
    stopped_early: str | None = None
    """Why the run watcher stopped the run (state stopped-early), with the step."""
    skipped_lines: list[dict[str, Any]] = field(default_factory=list)
    """Lines of the events files the reader refused ({source, lines, why}: grpo_deploy.common.metrics.SKIPPED)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _reward(step: dict[str, Any]) -> float | None:
    value = finite(step.get("reward"))
    return None if value is None else float(value)


ENDED = ("finished", STOPPED_EARLY, "failed")
"""Summary states of a run that has ended (`status --watch` stops following at them)."""
WATCH_FINDING_KEYS = ("kind", "level", "step", "message")


def watch_state(events: list[dict[str, Any]], watch=None) -> dict[str, Any] | None:
    """The watcher's state: the runtime's own `watch_summary` at the run's end when it is the newest word, else the
    run's steps replayed through a Watcher of config *watch* (a grpo_deploy.runtime.watch.config.WatchConfig or its
    dict, as Engine.watch renders it; None: unknown)."""
    starts = [e["time"] for e in events if e.get("event") == "run_start"]
    summaries = [e for e in events if e.get("event") == "watch_summary" and (not starts or e["time"] >= starts[-1])]
    if summaries:
        return _watch_read({k: v for k, v in summaries[-1].items() if k not in ("event", "time")})
    if watch is None:
        return None
    from grpo_deploy.runtime.watch.config import WatchConfig
    from grpo_deploy.runtime.watch.run_watch import history
    from grpo_deploy.runtime.watch.watcher import Watcher

    watcher = Watcher(WatchConfig.model_validate(watch) if isinstance(watch, dict) else watch)
    try:
        watcher.replay(history(events))
    except ArithmeticError:  # figures near the float's limit (a reward of 1e308 squared): no replay to show
        return None
    return _watch_read(watcher.state())


def _watch_read(state: dict[str, Any]) -> dict[str, Any]:
    """The watcher's state as status reads it: its words one printable line each, every other value a finite
    number or None (a `watch_summary` event is what a container wrote)."""
    words = {k: (one_line(state[k]) if state[k] is not None else None) for k in ("objective",) if k in state}
    lists = {k: [one_line(x) for x in state[k]] if isinstance(state[k], list) else [] for k in ("objectives", "active")
             if k in state}
    return {k: (v if k == "enabled" and isinstance(v, bool) else finite(v)) for k, v in state.items()} | words | lists


def watch_findings(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest `watch` event of each kind since the last run_start, unless its latest word is that it cleared."""
    starts = [e["time"] for e in events if e.get("event") == "run_start"]
    latest: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "watch" and (not starts or e["time"] >= starts[-1]):
            latest[str(e.get("kind"))] = e
    return [{k: (one_line(e.get(k)) if k == "message" else e.get(k)) for k in WATCH_FINDING_KEYS}
            for e in latest.values() if e.get("level") != "clear"]


def summarize(run: str, events: Iterable[dict[str, Any]], max_steps: int | None = None, watch=None) -> Summary:
    """The run's summary from its events; *watch* (a WatchConfig) lets a running run's watcher state be replayed."""
    events = sorted(events, key=lambda e: e.get("time", 0))
    s = Summary(run=run, state="not-started", max_steps=max_steps)
    if not events:
        return s
    by = lambda name: [e for e in events if e.get("event") == name]  # noqa: E731
    steps = sorted(by("step"), key=step_of)
    loads = by("adapter_load")
    start = by("run_start")
    up_start = by("up_start")
    ready = by("server_ready")
    built = [e for e in by("images_ready") if not up_start or e["time"] >= up_start[0]["time"]]
    s.images_build_s = finite(round(sum(finite(e.get("build_s")) or 0 for e in built), 2)) if built else None
    end = by("run_end")
    s.state = "starting"
    if start:
        s.run_uid, s.run_gid = (v if isinstance(v := start[-1].get(k), int) and finite(v) is not None else None
                                for k in ("uid", "gid"))
        s.umask = one_line(start[-1]["umask"], 8) if start[-1].get("umask") is not None else None
    if steps:
        s.state = "running"
        s.steps = step_of(steps[-1], len(steps))
        rewards = [_reward(e) for e in steps]
        s.reward_first5, s.reward_last5 = _mean(rewards[:5]), _mean(rewards[-5:])
        lengths = [e.get("completions/mean_length") for e in steps]
        s.completion_length_first5, s.completion_length_last5 = _mean(lengths[:5]), _mean(lengths[-5:])
        s.staleness_mean = _mean([e.get("sample/staleness_mean") for e in steps])
        ratios = [e["ratio"] for e in steps if finite(e.get("ratio")) is not None]
        if ratios:
            s.importance_ratio_min, s.importance_ratio_max = round(min(ratios), 4), round(max(ratios), 4)
        times = [e["time"] for e in steps]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        s.step_time_median_s = _median(gaps)
        origin = up_start[0]["time"] if up_start else (start[0]["time"] if start else None)
        if origin is not None:
            s.up_to_first_step_s = finite(round(steps[0]["time"] - origin - (s.images_build_s or 0), 2))
            s.wall_s = finite(round(steps[-1]["time"] - origin, 2))
            hours = (steps[-1]["time"] - origin) / 3600
            if hours > 0 and s.reward_last5 is not None:
                s.reward_per_hour = finite(round(sum(r for r in rewards if r is not None) / hours, 2))
        phases = sorted({k for e in steps[1:] for k in e if k.startswith(PHASE_PREFIX) and k not in NOT_PHASES})
        s.phase_medians_s = {one_line(k[len(PHASE_PREFIX):], 40): m for k in phases
                             if (m := _median([e.get(k) for e in steps[1:]])) is not None}
        s.kl_loss_last5 = _mean([e.get("actor/kl_loss") for e in steps][-5:])
        s.grad_norm_last5 = _mean([e.get("actor/grad_norm") for e in steps][-5:])
        if max_steps and s.step_time_median_s and s.steps < max_steps:
            s.eta_s = finite(round((max_steps - s.steps) * s.step_time_median_s, 1))
    s.adapter_loads_ok = sum(1 for e in loads if e.get("ok"))
    s.adapter_loads_failed = sum(1 for e in loads if not e.get("ok"))
    s.median_handoff_s = _median([e.get("handoff_s") for e in loads if e.get("ok")])
    s.adapter_file_modes = sorted({str(m) for e in loads for m in _modes(e)})
    if ready:  # the deployer records how long the server took from its start; else count from `up`
        s.server_ready_s = finite(ready[-1].get("seconds"))
        if s.server_ready_s is None and up_start:
            s.server_ready_s = round(ready[-1]["time"] - up_start[-1]["time"], 2)
    faults = by("storage_fault")
    if faults and (not start or faults[-1]["time"] >= start[-1]["time"]):
        s.fault = fault_text(events)
    s.watch, s.watch_findings = watch_state(events, watch), watch_findings(events)
    s.skipped_lines = [{"source": one_line(e.get("source"), 80), "lines": e["lines"], "why": e["why"]}
                       for e in by(SKIPPED) if isinstance(e.get("lines"), int) and isinstance(e.get("why"), dict)]
    # The trainer's own end, else the deployer's (`up` stopped before the trainer wrote one: preflight, a crash).
    last_end = end[-1] if end else (by("up_end")[-1] if by("up_end") else None)
    if last_end is not None:
        s.eta_s = None  # the run has ended: no time left to estimate
    if last_end is not None and last_end.get("status") == STOPPED_EARLY:
        s.state, s.stopped_early = STOPPED_EARLY, one_line(last_end.get("error") or "by the run watcher")
    elif last_end is not None:
        s.state = "finished" if last_end.get("status") == "ok" else "failed"
        s.error = last_end.get("error") or (None if last_end.get("status") == "ok" else last_end.get("status"))
    return s


PHASE_MILESTONES = (("images", "images_ready"), ("preflight", "preflight_done"), ("server ready", "server_ready"),
                    ("first step", "step"))
"""`up`'s phases: each ends at the first event of its name after the latest up_start."""


def phases(events: Iterable[dict[str, Any]]) -> list[tuple[str, float]]:
    """(phase, seconds) of the latest `up`: images, preflight, server ready, first step, the steps, and the total
    (up_start to the last event); a phase whose milestone is missing is left out."""
    events = sorted(events, key=lambda e: e.get("time", 0))
    starts = [e for e in events if e.get("event") == "up_start"]
    if not starts:
        return []
    events = [e for e in events if e["time"] >= starts[-1]["time"]]
    out, last = [], starts[-1]["time"]
    for name, milestone in PHASE_MILESTONES:
        hit = next((e for e in events if e.get("event") == milestone and e["time"] >= last), None)
        if hit is not None:
            out.append((name, hit["time"] - last))
            last = hit["time"]
    steps = [e for e in events if e.get("event") == "step"]
    if len(steps) > 1:
        out.append((f"{len(steps) - 1} more steps", steps[-1]["time"] - steps[0]["time"]))
    out.append(("total", events[-1]["time"] - starts[-1]["time"]))
    return out


def phases_text(events: Iterable[dict[str, Any]]) -> str:
    """`phases: images 212 s · preflight 3.1 s · ... · total 577 s` (one line), or '' before any `up`."""
    got = phases(events)
    if not got:
        return ""
    return "phases: " + " · ".join(f"{name} {s:.1f} s" if s < 10 else f"{name} {s:.0f} s" for name, s in got)


def fault_text(events: list[dict[str, Any]]) -> str | None:
    """The last storage_fault's message, with what the server saw of the same path when the deployer looked
    (a later server_view event)."""
    faults = [e for e in events if e.get("event") == "storage_fault"]
    if not faults:
        return None
    text = str(faults[-1].get("message"))
    seen = [e for e in events if e.get("event") == "server_view" and e.get("time", 0) >= faults[-1].get("time", 0)]
    if seen:
        text += (f" As the server (uid {seen[-1].get('uid')}:{seen[-1].get('gid')}) sees it: "
                 f"{seen[-1].get('words')}.")
    return text


def _modes(event: dict[str, Any]) -> list[str]:
    mode = event.get("mode") or event.get("file_mode")
    if isinstance(mode, dict):
        return list(mode.values())
    return [mode] if mode else []


def progress_line(step: dict[str, Any], max_steps: int | None,
                  fields: tuple[tuple[str, str, str], ...] = ()) -> str:
    """One line per step: the step, reward and completion length, then the engine's own *fields* (label, step event
    key, format: Engine.progress)."""
    def f(key: str, fmt: str) -> str:
        value = finite(step.get(key))
        return "-" if value is None else format(value, fmt)

    total = f"/{max_steps}" if max_steps else ""
    return printable("  ".join([f"step {f('step', 'd') if isinstance(step.get('step'), int) else '-'}{total}",
                                f"reward {f('reward', '.3f')}", f"len {f('completions/mean_length', '.1f')}",
                                *(f"{label} {f(key, fmt)}" for label, key, fmt in fields)]))


def summary_text(s: Summary) -> str:
    def n(v, fmt=".3f", unit=""):
        return "-" if v is None else f"{format(v, fmt)}{unit}"

    lines = [
        f"run {s.run}: {s.state}, {s.steps}{'/' + str(s.max_steps) if s.max_steps else ''} optimizer steps"
        + (" (stopped by a shared-volume fault, below)" if s.fault else f" (error: {s.error})" if s.error else ""),
        f"  reward              first 5 steps {n(s.reward_first5)} -> last 5 steps {n(s.reward_last5)}",
        f"  completion length   {n(s.completion_length_first5, '.1f')} -> {n(s.completion_length_last5, '.1f')} tokens",
    ]
    if not s.phase_medians_s:  # a run that hands adapters over (TRL); a verl run times its phases instead
        lines += [
            f"  adapter syncs       {s.adapter_loads_ok} loaded, {s.adapter_loads_failed} failed, median hand-off "
            f"{n(s.median_handoff_s, '.3f', ' s')} (save -> loaded)",
            f"  staleness           mean {n(s.staleness_mean, '.2f')}; importance ratio "
            f"{n(s.importance_ratio_min, '.4f')}..{n(s.importance_ratio_max, '.4f')}"]
    else:
        lines += [
            "  phases (median)     " + " · ".join(f"{k} {v:.2f} s" for k, v in s.phase_medians_s.items()),
            f"  KL / grad norm      last 5 steps {n(s.kl_loss_last5, '.4f')} / {n(s.grad_norm_last5, '.3f')}"]
    lines += [
        f"  step time           median {n(s.step_time_median_s, '.2f', ' s')}; reward per wall-clock hour "
        f"{n(s.reward_per_hour, '.1f')}",
        f"  start-up            server ready {n(s.server_ready_s, '.1f', ' s')}; up -> first step "
        f"{n(s.up_to_first_step_s, '.1f', ' s')} (image build {n(s.images_build_s, '.1f', ' s')}, not counted)",
        f"  identity            uid {n(s.run_uid, 'd')} gid {n(s.run_gid, 'd')} umask {s.umask or '-'}; adapter "
        f"file modes {', '.join(s.adapter_file_modes) or '-'}",
    ]
    if s.fault:
        lines.append(f"  stopped by          {s.fault}")
    lines += watch_lines(s)
    if s.eta_s is not None:
        lines.append(f"  ETA                 {s.eta_s / 60:.1f} min")
    return printable("\n".join(lines + note_lines(s)))


def note_lines(s: Summary) -> list[str]:
    """`note: 2 lines of metrics.jsonl skipped (a line over 1 MiB, a number too long)`: one line per events file
    whose reader refused lines (status and diagnose print it)."""
    return [f"note: {n['lines']} line{'s' if n['lines'] != 1 else ''} of {n['source']} skipped "
            f"({', '.join(sorted(one_line(why, 60) for why in n['why']))})" for n in s.skipped_lines]


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} GPU-h"


def watch_lines(s: Summary) -> list[str]:
    """The run watcher's part of the summary: the reward's trend and a plateau with the compute spent after it, answers
    at the cap, time to the target, the loss objective; then what it found and still stands, and a stop's saving."""
    w = s.watch
    if not w or not w.get("enabled", True):
        return []
    parts, has = [], lambda *keys: all(w.get(k) is not None for k in keys)
    if has("slope_per_step", "reward_trend", "gain_per_window", "window"):
        parts.append(f"reward trend {w['reward_trend']:.3f}, {w['gain_per_window']:+.3f} per {w['window']} steps")
    if w.get("plateau_since") is not None:
        after = w.get("steps_after_plateau")
        spent = [f"~{after * s.step_time_median_s / 60:.1f} min"] if after and s.step_time_median_s else []
        spent += [_hours(w.get("gpu_hours_after_plateau"))] if w.get("gpus") else []
        parts.append(f"flat since step {w['plateau_since']} ({after} steps{', ' if spent else ''}{', '.join(spent)} "
                     "after it)")
    if has("cap_share_peak", "cap_share_latest"):
        parts.append(f"answers at the cap {w['cap_share_latest']:.0%} (peak {w['cap_share_peak']:.0%})")
    if w.get("target_reward") is not None:
        eta = w.get("time_to_target_s")
        parts.append(f"target {w['target_reward']:g} " + (f"in ~{w.get('time_to_target_steps'):.0f} steps "
                                                          f"(~{eta / 60:.1f} min)" if has("time_to_target_s",
                                                                                          "time_to_target_steps")
                                                          else "not in sight at this trend"))
    lines = [f"  run watcher         {'; '.join(parts) or 'too few steps for a trend'}"]
    if w.get("objective"):
        lines.append(f"  loss objective      {w['objective']}")
    lines += [f"  watcher found       step {f['step']}: {f['message']}" for f in s.watch_findings]
    if s.stopped_early:
        left = (s.max_steps - s.steps) if s.max_steps else None
        spared = (f"; {left} planned steps not run (~{left * s.step_time_median_s / 60:.1f} min"
                  f"{', ' + _hours(w.get('gpu_hours_saved')) if w.get('gpus') else ''})"
                  if left and s.step_time_median_s else "")
        lines.append(f"  stopped early       {s.stopped_early}{spared}")
    return [printable(line) for line in lines]


def plot_title(run: str = "") -> str:
    """The plot's title for run *run* (`grpo-deploy up` and `grpo-deploy status --plot` alike)."""
    return f"grpo-deploy run {run}".rstrip()


def _watch_marks(ax, events: list[dict[str, Any]]) -> tuple[str, ...]:
    """On the reward panel: where the run watcher found the reward flat (and where it stopped the run), and the
    target reward it estimates the time to; the labels drawn."""
    drawn = []
    flat = [e for e in events if e.get("event") == "watch" and e.get("kind") == "plateau" and e.get("level") == "warn"]
    stop = [e for e in events if e.get("event") == "watch" and e.get("kind") == "plateau_stop"]
    armed = [e for e in events if e.get("event") == "watch_armed" and finite(e.get("target_reward")) is not None]
    for found, style, label in ((flat, ":", "watcher: flat"), (stop, "--", "watcher: stop")):
        if found and finite(found[-1].get("step")) is not None:
            ax.axvline(found[-1]["step"], color="tab:red", linestyle=style, label=label)
            drawn.append(label)
    if armed:
        ax.axhline(armed[-1]["target_reward"], color="tab:green", linestyle=":", label="target reward")
        drawn.append("target reward")
    return tuple(drawn)


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed: it comes with the kit's `plot` extra, not with the deployer itself."""


def plot(events: list[dict[str, Any]], path: str, title: str = "") -> str:
    """Reward and completion length per step, then staleness (TRL) or the seconds of each phase and the gradient
    norm and KL loss (verl: its events carry timing_s/*), to a PNG."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("the plot needs matplotlib: pip install 'grpo-deploy[plot]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted((e for e in events if e.get("event") == "step"), key=step_of)
    x = [finite(e.get("step")) for e in steps]
    phases = sorted({k for e in steps for k in e if k.startswith(PHASE_PREFIX) and k not in NOT_PHASES})
    panels = [(("reward",), "reward"), (("completions/mean_length",), "completion length (tokens)")]
    if phases:  # verl: where a step's time goes, and the update's size (seed 000's telemetry)
        panels += [(tuple(phases), "seconds per step, by phase"), (("actor/grad_norm", "actor/kl_loss"),
                                                                   "grad norm / KL loss")]
    else:
        panels.append((("sample/staleness_mean",), "staleness (updates)"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.3 * len(panels) + 0.1), sharex=True)
    for ax, (keys, label) in zip(axes, panels, strict=True):
        for key in keys:
            name = one_line(key.removeprefix(PHASE_PREFIX), 40).replace("$", r"\$")  # a container's key: no mathtext
            ax.plot(x, [finite(e.get(key)) for e in steps], marker=".", label=name)
        if keys == ("reward",):
            keys += _watch_marks(ax, events)
        if len(keys) > 1:
            ax.legend(fontsize="small")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("optimizer step")
    fig.suptitle(title or plot_title())
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
