"""The plan's forecast (pure): a run's steps, seconds per step, start-up, wall time, GPU-hours and cost before it
starts, each figure with its source, the loss normalisation it will train with, and a what-if table of the knobs
the seeds turned. Every fact comes in as an argument (the resolved spec, the run's own events read by the caller);
nothing here reads a file or a clock.

Sources, first found wins: (1) this run name's own metrics (the copy the deployer keeps under .grpo-deploy/<run>/:
the mean step after the first, `up` -> first step), (2) `bench trainer` results (the kit keeps none it can read:
BENCH_NOT_KEPT), (3) the profile's `reference:` figures, each naming where it was measured. A figure with no source is
unknown (None), never a guess.

Wall time = start-up (`up` -> the end of the first step) + (steps - 1) x seconds per step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_deploy.common.table import table
from grpo_deploy.status import summarize

UNKNOWN = "unknown"
BENCH_NOT_KEPT = ("no `bench trainer` results: the kit keeps none it can read here (a report goes where its --out "
                  "says, on the GPU machine, and times forward+backward only, not a whole step)")
ORDER = ("steps", "step_s", "startup_s", "train_s", "wall_s", "gpus", "gpu_hours", "cost")
"""The figures, in the order plan prints them."""
LABELS = {"steps": "steps", "step_s": "seconds per step", "startup_s": "start-up (up -> first step)",
          "train_s": "training after the first step", "wall_s": "wall time", "gpus": "GPUs in use",
          "gpu_hours": "GPU-hours", "cost": "cost"}
MIN_MEASURED_STEPS = 2
"""Steps a run's own metrics need for a step time (the mean gap after the first step)."""


@dataclass(frozen=True)
class Figure:
    value: float | None
    """None: unknown."""
    unit: str
    source: str
    """Where the value came from, or why it is unknown: never empty."""


@dataclass(frozen=True)
class WhatIf:
    knob: str
    current: str
    proposed: str
    factor: float
    on: str
    """What the factor multiplies: "step time" or "steps"."""
    steps: int | None
    step_s: float | None
    train_s: float | None
    wall_s: float | None
    gpu_hours: float | None
    source: str


@dataclass
class Forecast:
    figures: dict[str, Figure]
    objective: str
    what_if: list[WhatIf]
    currency: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Forecast:
        return cls(figures={k: Figure(**v) for k, v in data["figures"].items()}, objective=data["objective"],
                   what_if=[WhatIf(**w) for w in data["what_if"]], currency=data.get("currency"),
                   notes=list(data.get("notes", [])))


# ------------------------------------------------------------------ measured figures


@dataclass(frozen=True)
class Measured:
    """What a run's own events say: seconds per step and start-up (None when they cannot say), and from where."""

    step_s: float | None
    startup_s: float | None
    steps: int
    source: str


def measured(run: str, events: list[dict] | None, where: str) -> Measured | None:
    """A run's own figures from its *events* (the deployer's and the trainer's, latest `up`), read from *where*; None
    when there are too few steps. The same summary `status` shows (grpo_deploy.status.summarize)."""
    if not events:
        return None
    summary = summarize(run, events)
    times = sorted(e["time"] for e in events if e.get("event") == "step" and isinstance(e.get("time"), int | float))
    if summary.steps < MIN_MEASURED_STEPS or len(times) < MIN_MEASURED_STEPS:
        return None
    # the mean, not the median: a wall time is a sum of steps, slow ones included (saves, a sync that waits); the
    # rehearsal's median step (2.42 s against a mean of 3.48 s) forecast its own 40 steps 21 % short
    step_s = (times[-1] - times[0]) / (len(times) - 1)
    started_by_up = any(e.get("event") == "up_start" for e in events)
    return Measured(round(step_s, 4), summary.up_to_first_step_s if started_by_up else None, summary.steps,
                    f"run {run}'s own metrics ({where}: {summary.steps} steps, the mean after the first)")


# ------------------------------------------------------------------ the run's GPUs


def gpus_in_use(res) -> tuple[int, str]:
    """GPUs the run's hosts hold (each host's GPUs as the engine splits them among its roles), and how it counted."""
    parts = []
    for host in res.spec.hosts:
        profile = res.profiles[host.name]
        ids = res.engine_info.gpus_held(res, host)
        parts.append(f"{host.name} {len(ids)} ({','.join(map(str, ids))})" if ids else
                     f"{host.name} none (profile {profile.name}: no accelerator)")
    return res.engine_info.gpus_in_use(res), "GPUs of the run's hosts as its roles hold them: " + "; ".join(parts)


# ------------------------------------------------------------------ the forecast


def _reference(res) -> tuple[str, dict]:
    """The main role's profile and its reference figures for the run's engine."""
    host = res.host_for(res.engine_info.main_role) or res.spec.hosts[0]
    profile = res.profiles[host.name]
    return profile.name, profile.reference.get(res.engine, {})


def _pick(key: str, mine: float | None, mine_source: str, profile: str, refs: dict, why_mine: str) -> Figure:
    if mine is not None:
        return Figure(round(mine, 2), "s", mine_source)
    ref = refs.get(key)
    if ref is not None:
        return Figure(ref.value, "s", f"profile {ref.profile} reference: {ref.source}")
    return Figure(None, "s", f"{UNKNOWN}: {why_mine}; {BENCH_NOT_KEPT}; profile {profile} gives no reference "
                             f"{key}")


def _wall(steps: int | None, step_s: float | None, startup_s: float | None) -> tuple[float | None, float | None]:
    """(training after the first step, wall) in seconds, None where a term is unknown."""
    if not steps or step_s is None:
        return None, None
    train = (steps - 1) * step_s
    return round(train, 1), (round(startup_s + train, 1) if startup_s is not None else None)


def _gpu_hours(gpus: int, wall: float | None, train: float | None) -> tuple[float | None, str]:
    if gpus == 0:
        return 0.0, "no GPU in use"
    if wall is not None:
        return round(gpus * wall / 3600, 2), f"{gpus} GPU(s) x wall time"
    if train is not None:
        return round(gpus * train / 3600, 2), (f"{gpus} GPU(s) x training after the first step (start-up unknown, not "
                                               "counted: a lower bound)")
    return None, f"{UNKNOWN}: the step time is unknown"


def make_forecast(res, events: list[dict] | None = None, events_where: str = "", events_note: str = "",
                  tuned: tuple[dict[str, dict], str] = ({}, "")) -> Forecast:
    """The forecast of *res*: *events* are this run name's own (latest `up`), read by the caller from *events_where*;
    *events_note* says why there are none (missing, unreadable). *tuned*: the step-time factors a `tune` of this run
    measured on its hosts, and its date (tune.report.measured_factors): the first source of a what-if's factor."""
    profile, refs = _reference(res)
    run = res.spec.run.name
    mine = measured(run, events, events_where)
    why_mine = events_note or (f"run {run}'s metrics have fewer than {MIN_MEASURED_STEPS} steps" if events
                               else f"no metrics of run {run} kept here")
    steps = res.engine_info.total_steps(res) or None
    figures: dict[str, Figure] = {
        "steps": Figure(steps, "steps", f"engine {res.engine}'s total steps from the settings" if steps
                        else f"{UNKNOWN}: the settings give no step count")}
    figures["step_s"] = _pick("step_s", mine and mine.step_s, mine.source if mine else "", profile, refs, why_mine)
    startup_mine = mine.startup_s if mine else None
    figures["startup_s"] = _pick("startup_s", startup_mine, mine.source if mine else "", profile, refs,
                                 why_mine if not mine else f"run {run}'s metrics hold no `up` start")
    step_s, startup_s = figures["step_s"].value, figures["startup_s"].value
    train, wall = _wall(steps, step_s, startup_s)
    figures["train_s"] = Figure(train, "s", "(steps - 1) x seconds per step" if train is not None
                                else f"{UNKNOWN}: steps or seconds per step unknown")
    figures["wall_s"] = Figure(wall, "s", "start-up + (steps - 1) x seconds per step" if wall is not None
                               else f"{UNKNOWN}: " + ("start-up unknown" if train is not None
                                                      else "steps or seconds per step unknown"))
    gpus, gpu_source = gpus_in_use(res)
    figures["gpus"] = Figure(gpus, "GPUs", gpu_source)
    hours, hours_source = _gpu_hours(gpus, wall, train)
    figures["gpu_hours"] = Figure(hours, "GPU-h", hours_source)
    cost = res.spec.cost
    if cost is not None:
        figures["cost"] = Figure(round(hours * cost.gpu_hour, 2) if hours is not None else None, cost.currency,
                                 f"cost.gpu_hour {cost.gpu_hour:g} {cost.currency} x GPU-hours" if hours is not None
                                 else f"{UNKNOWN}: GPU-hours unknown")
    rows = what_if(res, refs, steps, step_s, startup_s, gpus, tuned)
    return Forecast(figures=figures, objective=res.engine_info.loss_objective(res), what_if=rows,
                    currency=cost.currency if cost else None, notes=[events_note] if events_note else [])


def _row(knob: str, current: str, proposed: str, factor: float, on: str, steps: int | None, step_s: float | None,
         startup_s: float | None, gpus: int, source: str) -> WhatIf:
    train, wall = _wall(steps, step_s, startup_s)
    hours = _gpu_hours(gpus, wall, train)[0]
    return WhatIf(knob, current, proposed, round(factor, 3), on, steps, None if step_s is None else round(step_s, 2),
                  train, wall, hours, source)


def what_if(res, refs: dict, steps: int | None, step_s: float | None, startup_s: float | None,
            gpus: int, tuned: tuple[dict[str, dict], str] = ({}, "")) -> list[WhatIf]:
    """One row per knob that a `tune` of this run measured (its factor first: measured on these hosts), then per knob
    of the run's engine (Engine.what_if) that has a sourced factor (the profile's reference), plus the epochs where
    the engine counts its steps from them (an exact factor on the step count)."""
    rows = []
    from grpo_deploy.tune.knobs import current as current_value

    measured, date = tuned
    for name, got in measured.items():
        knob = next((k for k in res.engine_info.tune_knobs if k.name == name), None)
        if knob is None:
            continue
        more_gpus = knob.what_if(res)[4] if knob.what_if and knob.what_if(res) else 0
        source = (f"measured by tune on these hosts, {date}: trial {got.get('trial')!r}'s s/step over its "
                  f"{got.get('baselines')} baseline(s)'")
        rows.append(_row(knob.label or knob.name, str(current_value(res, knob.setting)), str(got.get("value")),
                         float(got["factor"]),
                         "step time", steps, None if step_s is None else step_s * float(got["factor"]), startup_s,
                         gpus + more_gpus, source))
    for knob in res.engine_info.what_if:
        if knob.name in measured:
            continue
        current, proposed, key, invert, more_gpus = knob.what_if(res)
        ref = refs.get(key)
        if ref is None:
            continue
        factor = 1 / ref.value if invert else ref.value
        source = f"profile {ref.profile} reference {key} = {ref.value:g}" + (" (inverted)" if invert else "") + \
            f": {ref.source}"
        rows.append(_row(knob.label or knob.name, current, proposed, factor, "step time", steps,
                         None if step_s is None else step_s * factor, startup_s, gpus + more_gpus, source))
    epochs = _epochs_row(res, steps, step_s, startup_s, gpus)
    return rows + ([epochs] if epochs else [])


SEED000_EPOCHS = 3
"""Seed 000: validation accuracy reached ~83 % within 3 of 15 epochs; the other 12 added ~2 %."""


def _epochs_row(res, steps: int | None, step_s: float | None, startup_s: float | None, gpus: int) -> WhatIf | None:
    epochs = res.engine_info.epochs(res)
    if not epochs or not steps:
        return None
    proposed = SEED000_EPOCHS if epochs > SEED000_EPOCHS else 2 * epochs
    new_steps = steps // epochs * proposed
    why = (f"; seed 000 reached ~83 % accuracy within {SEED000_EPOCHS} of 15 epochs" if proposed == SEED000_EPOCHS
           else "")
    return _row("epochs", str(epochs), str(proposed), new_steps / steps, "steps", new_steps, step_s, startup_s, gpus,
                f"exact: steps = prompts // data.train_batch_size x epochs (engine {res.engine}'s total steps)" + why)


# ------------------------------------------------------------------ text


def _value(f: Figure, key: str) -> str:
    if f.value is None:
        return UNKNOWN
    if f.unit == "s":
        return duration(f.value)
    if key == "steps" or key == "gpus":
        return f"{int(f.value)}"
    return f"{f.value:,.2f} {f.unit}"


def duration(seconds: float) -> str:
    """Seconds as `1 h 02 min`, `3 min 05 s` or `8.6 s`."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m:02d} min"


WHAT_IF_HEADERS = ["knob", "change", "factor", "training", "wall", "GPU-h", "source"]
SOURCE_MIN = 20  # the narrowest `source` column the what-if table is drawn with (table's own floor)


def forecast_text(fc: Forecast, width: int | None = None) -> str:
    """The forecast block of `plan`: one line per figure with its source, the objective, then the what-if table. On a
    terminal *width* columns wide where the table's other columns leave `source` under SOURCE_MIN, each knob's GPU-hours
    and source go under the table instead (one line each, for the terminal to wrap between words)."""
    lines = ["forecast:"]
    for key in ORDER:
        if key in fc.figures:
            f = fc.figures[key]
            lines.append(f"  {LABELS[key]:<31} {_value(f, key):<14} (source: {f.source})")
    lines.append(f"  loss normalisation              {fc.objective}")
    lines += [f"  note: {note}" for note in fc.notes]
    if fc.what_if:
        rows = [[w.knob, f"{w.current} -> {w.proposed}", f"x{w.factor:g} {w.on}",
                 UNKNOWN if w.train_s is None else duration(w.train_s),
                 UNKNOWN if w.wall_s is None else duration(w.wall_s),
                 UNKNOWN if w.gpu_hours is None else f"{w.gpu_hours:,.2f}", w.source] for w in fc.what_if]
        lines.append("what if (one knob at a time, from the forecast above):")
        fixed = sum(max(len(str(r[i])) for r in [WHAT_IF_HEADERS, *rows]) + 2 for i in range(len(WHAT_IF_HEADERS) - 1))
        if width is not None and fixed + SOURCE_MIN > width:
            lines.append(table(WHAT_IF_HEADERS[:-2], [r[:-2] for r in rows], max_width=width))
            lines += [f"  {r[0]}: {r[-2]} GPU-h; source: {r[-1]}" for r in rows]
        else:
            lines.append(table(WHAT_IF_HEADERS, rows, max_width=width))
    else:
        lines.append("what if: no knob of this engine has a measured factor for this profile")
    return "\n".join(lines)
