"""The run watcher's settings types: the spec's `watch:` knobs (`WatchSettings`, which the spec imports), the
engine's metric names (`MetricKeys`) and what the runtime's watcher reads (`WatchConfig`, rendered into trainer.yaml
`watch:` or verl's node json). Defaults and the measurements behind them: docs/MEASUREMENTS.md."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from grpo_deploy.common.strict import Strict
from grpo_deploy.common.values import MAX_STEPS, Count, Finite, NonNegative, Text, no_bool

Steps = Annotated[int, BeforeValidator(no_bool), Field(ge=0, le=MAX_STEPS)]
Window = Annotated[int, BeforeValidator(no_bool), Field(ge=5, le=10_000)]


def _pair(value: Any) -> Any:
    """A YAML/JSON list of two numbers as the tuple the band is (strict models take no list for a tuple)."""
    if isinstance(value, list):
        if len(value) != 2:
            raise ValueError(f"expected two numbers [low, high], got {len(value)}")
        return tuple(value)
    return value


def _band(value: tuple[float, float]) -> tuple[float, float]:
    low, high = value
    if not 0 < low < 1 < high <= 100:
        raise ValueError(f"the band must hold 1 with 0 < low < 1 < high <= 100, got [{low}, {high}]")
    return value


RatioBand = Annotated[tuple[Finite, Finite], BeforeValidator(_pair), AfterValidator(_band)]
CAP_SHARE_AUTO = 0.2
"""The answer-cap bound `cap_share: auto` means where the run's rewards are not all length rewards."""


class WatchSettings(Strict):
    """The run watcher's knobs (the spec's `watch:` section): what counts as a plateau and what to do about it, and
    the bounds of the other alarms. Defaults and the measurements behind them: docs/MEASUREMENTS.md."""

    enabled: bool = True
    """Watch the run (the watcher only reads metrics; off, nothing is flagged and status shows no trend)."""
    action: Literal["warn", "stop"] = "warn"
    """What a plateau (once `patience` is spent) and a stale policy (at once) do: warn only, or save and stop the run.
    A stale policy: the server answers as the base model under the newest adapter's name (the served-policy check)."""
    window: Window = 100
    """Steps the reward trend is fitted over (the moving average, its slope and the noise around it). Longer sees a
    plateau later, and no surer: the watcher fits over more steps on its own when the reward is noisier (series.py:
    the slope's error held to min_gain / 2.5), so this is the shortest stretch. At the default a plateau is caught ~90
    steps after it starts under per-step noise 0.02, ~155 under 0.05 (128 binary answers a step)."""
    patience: Steps = 50
    """Steps the plateau must persist after the warning before `action: stop` stops the run."""
    min_gain: Finite = Field(0.02, gt=0, le=1e6)
    """Reward units per `window` steps (0.02 = two points of accuracy per 100 steps at the default window): a gain
    below this counts as flat, even when the reward still rises."""
    target_reward: Finite | None = None
    """A reward to estimate the time to (from the trend and the seconds per step); null: no estimate."""
    cap_share: Annotated[Finite, Field(gt=0, le=1)] | Literal["auto"] | None = "auto"
    """Warn when the share of answers cut at the length cap exceeds this (0..1]; null: off. auto: 0.2, and off when
    every reward of the run is a length reward (brevity, 1 - length / cap: a base model's answers run to the cap, and
    the reward is paid for leaving it; the cpu rehearsal's first answers, 73-91 % at its 24-token cap, would need a
    cap near 120 tokens to stay under 0.2)."""
    length_drift: Finite | None = Field(0.15, gt=0, le=100)
    """Warn when the mean completion length changes by more than this share of itself over a window (null: off)."""
    kl_max: Finite | None = Field(0.5, gt=0, le=1e6)
    """Warn when the KL to the reference exceeds this (null: off)."""
    ratio_band: RatioBand | None = (0.8, 1.2)
    """Warn when the mean importance ratio (policy / behaviour) leaves [low, high] (PPO's clip range at epsilon
    0.2; null: off)."""
    staleness_drop_share: Finite | None = Field(0.25, gt=0, le=1)
    """Warn when the share of generated samples dropped as stale exceeds this (null: off)."""


class MetricKeys(Strict):
    """The engine's names for what the watcher reads (the engine module fills these; null: the engine does not log
    it, and that alarm stays silent)."""

    reward: Text = "reward"
    """The mean reward of the step's answers."""
    length: Text | None = "completions/mean_length"
    """The mean completion length in tokens."""
    capped: Text | None = "completions/clipped_ratio"
    """The share (0..1) of answers that hit the length cap."""
    kl: Text | None = "kl"
    """The KL to the reference policy."""
    ratio: Text | None = "ratio"
    """The mean importance ratio of the trained tokens."""
    staleness: Text | None = "sample/dropped_stale_total"
    """Samples dropped as stale since the last logged step."""
    samples: Text | None = "batch/samples_per_step"
    """Samples trained in the step (the other side of the staleness share)."""
    validation: Text | None = None
    """A validation score logged on some steps only."""


class WatchConfig(Strict):
    """What the runtime's watcher reads (rendered into trainer.yaml `watch:` or verl's node json)."""

    settings: WatchSettings = WatchSettings()
    keys: MetricKeys = MetricKeys()
    total_steps: Count | None = None
    """The planned end of the run (for the GPU-hours a stop saves); null: unknown."""
    gpus: NonNegative = 1
    """GPUs the run holds (for GPU-hours; 0: a CPU run, whose GPU-hours are 0)."""
    max_completion_length: Count | None = None
    """The length cap in tokens (named in the cap and drift messages)."""
    objective: Text | None = None
    """A short name of the loss normalisation, e.g. "per-token over packed rows" or "per-answer mean"."""
