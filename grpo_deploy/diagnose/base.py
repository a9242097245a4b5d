"""What both engines' bottleneck diagnoses share (pure, no I/O): the Diagnosis and Knob types, reading the step events,
and diagnosis_text, the text `grpo-deploy diagnose` prints with the labels each engine gives for its evidence. The
events are what a container wrote: a figure is read only when it is a finite number, and the text is printed through
grpo_deploy.common.shown.printable."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_deploy.common.shown import printable


@dataclass(frozen=True)
class Knob:
    setting: str  # the spec key to change, exactly as written in grpo-deploy.yaml
    value: str  # what to set it to
    why: str  # one line


@dataclass
class Diagnosis:
    side: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    next_knobs: list[Knob] = field(default_factory=list)
    not_recorded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- reading events ---------------------------------------------------------------------------------------------
def is_number(value: Any) -> bool:
    """A finite number, not a bool (and not an int past the float's range)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def values_of(steps: list[dict], key: str) -> list[float]:
    return [float(s[key]) for s in steps if is_number(s.get(key))]


def recorded(steps: list[dict], key: str) -> bool:
    return any(key in s for s in steps)


def rounded(value: float | None, digits: int = 4) -> float | None:
    """*value* rounded; None when it is none or not finite (figures near the float's limit overflow)."""
    return None if value is None or not math.isfinite(value) else round(value, digits)


def mean(values: list[float]) -> float | None:
    try:
        value = statistics.fmean(values) if values else None
    except OverflowError:  # figures near the float's limit (1e308 twice): what a container wrote, not a mean
        return None
    return value if value is None or math.isfinite(value) else None


def share_of(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def step_events(events: Iterable[Mapping[str, Any]]) -> list[dict]:
    """The trainer's `step` events in time order (the sink appends across resumes; `run_events` cuts to the last up)."""
    return sorted((dict(e) for e in events if e.get("event") == "step"), key=lambda e: e.get("time", 0))


# --- text -------------------------------------------------------------------------------------------------------
def _figure(key: str, value: Any, labels: Mapping[str, tuple[str, str, str]]) -> str:
    _, fmt, unit = labels[key]
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{format(value, fmt)}{unit}" if fmt and is_number(value) else str(value)


def diagnosis_text(d: Diagnosis, labels: Mapping[str, tuple[str, str, str]]) -> str:
    """What `grpo-deploy diagnose` prints (*labels*: the engine's evidence keys: label, format, unit)."""
    lines = [f"diagnosis: {d.side}", f"  {d.reason}", "", "evidence:"]
    width = max(len(label) for label, _, _ in labels.values())
    lines += [f"  {labels[k][0]:<{width}}  {_figure(k, v, labels)}" for k, v in d.evidence.items()
              if k in labels and v is not None]
    if d.next_knobs:
        lines += ["", "next knobs, in order:"]
        lines += [f"  {i}. {k.setting}: {k.value}\n     {k.why}" for i, k in enumerate(d.next_knobs, 1)]
    if d.notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in d.notes]
    if d.not_recorded:
        lines += ["", "not recorded:"] + [f"  - {m}" for m in d.not_recorded]
    return printable("\n".join(lines))
