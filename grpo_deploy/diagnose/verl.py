"""verl's bottleneck diagnosis (pure, no I/O): the kit's step events of a verl run (verl's own `timing_s/*` per
phase, carried by grpo_deploy.runtime.verl.node) -> the phase that bounds a step (generation, old log-prob,
reference, actor update), the figures that say so, and the seed-000 knobs to change next: rollout tensor parallelism,
`gpu_memory_utilization`, `rollout.n`, the PPO mini- and micro-batch sizes.

Seed 000's own tuning on 4xA100 (shared/seeds): TP 4 -> 1 took the ETA from 9.5 h to 6.5 h (a 3B model fits one
GPU: TP only paid communication); `gpu_memory_utilization` 0.6 left ~20 GB idle per card, 0.9 ran out of memory,
0.8 was the sweet spot; `rollout.n` 10 cost +70 % time for little gain over 5; PPO mini-batch 512 over the default
used the cards. A metric a rule needs that the events lack is named ("not recorded"), never guessed.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from grpo_deploy.diagnose.base import Diagnosis, Knob, is_number, mean, rounded

PHASES = {"generation": "timing_s/gen", "old log-prob": "timing_s/old_log_prob", "reference": "timing_s/ref",
          "actor update": "timing_s/update_actor"}
"""verl's per-phase step timings (seconds per step) the diagnosis weighs."""
STEP = "timing_s/step"
MIN_STEPS = 5
"""Steps needed before a verdict; step 1 is left out (vLLM's warm-up: 12-44 s of generation on the rehearsal)."""
BOUND_SHARE = 0.5
"""A phase holding at least half of the step bounds it; below that the run is balanced."""
SEED_GPU_MEMORY = 0.8
"""Seed 000's sweet spot for actor_rollout_ref.rollout.gpu_memory_utilization (0.9 ran out of memory)."""
SEED_N = 5
"""Seed 000's rollout.n: 10 cost +70 % time for little gain on GSM8K."""

LABELS: dict[str, tuple[str, str, str]] = {
    "steps": ("steps read", "d", ""),
    "step_time_median_s": ("median step time", ".2f", " s"),
    "generation_share": ("generation share of step", ".0%", ""),
    "old_log_prob_share": ("old log-prob share of step", ".0%", ""),
    "reference_share": ("reference share of step", ".0%", ""),
    "actor_update_share": ("actor update share of step", ".0%", ""),
    "reward_first": ("reward, first steps", ".3f", ""),
    "reward_last": ("reward, last steps", ".3f", ""),
    "kl_loss_last": ("KL loss, last steps", ".4f", ""),
    "grad_norm_last": ("gradient norm, last steps", ".3f", ""),
    "response_length_last": ("response length, last steps", ".0f", " tokens"),
    "rollout_tp": ("rollout tensor parallelism", "d", ""),
    "gpu_memory_utilization": ("rollout gpu_memory_utilization", ".2f", ""),
    "rollout_n": ("samples per prompt (rollout.n)", "d", ""),
    "ppo_micro_batch_size_per_gpu": ("PPO micro-batch per GPU", "d", ""),
}


def _median(values: list[float]) -> float | None:
    values = [v for v in values if is_number(v)]  # a phase's share of a step: inf or NaN when a container wrote so
    return rounded(statistics.median(values)) if values else None


def _last(steps: list[dict], key: str, window: int = 5) -> float | None:
    return rounded(mean([float(s[key]) for s in steps[-window:] if is_number(s.get(key))]))


def _first(steps: list[dict], key: str, window: int = 5) -> float | None:
    return _last(steps[:window], key, window)


def settings_hint(res) -> dict[str, Any]:
    """The verl settings the events do not carry, from a resolved spec (grpo_deploy.spec.resolve.Resolved)."""
    verl = res.settings.verl
    extra = verl.model_extra or {}
    return {"rollout_tp": verl.rollout_tp, "gpu_memory_utilization": verl.rollout_memory, "rollout_n": verl.rollout_n,
            "ppo_mini_batch_size": verl.ppo_mini_batch_size or verl.train_batch_size,
            "train_batch_size": verl.train_batch_size,
            "ppo_micro_batch_size_per_gpu": extra.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
            "log_prob_micro_batch_size_per_gpu": extra.get(
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu")}


def _knob(key: str, value: Any, why: str) -> Knob:
    return Knob(f"overrides.verl.{key}", str(value), why)


def _generation_knobs(hint: Mapping[str, Any]) -> list[Knob]:
    knobs = []
    if (hint.get("rollout_tp") or 1) > 1:
        knobs.append(_knob("actor_rollout_ref.rollout.tensor_model_parallel_size", 1,
                           "a model that fits one GPU pays only communication for TP (seed 000: TP 4 -> 1, ETA "
                           "9.5 h -> 6.5 h); plan says whether it fits"))
    if (hint.get("gpu_memory_utilization") or 0) < SEED_GPU_MEMORY:
        knobs.append(_knob("actor_rollout_ref.rollout.gpu_memory_utilization", SEED_GPU_MEMORY,
                           "more KV cache, more sequences at once (seed 000: 0.6 left ~20 GB idle per A100, 0.9 ran "
                           "out of memory, 0.8 was the sweet spot)"))
    if (hint.get("rollout_n") or 0) > SEED_N:
        knobs.append(_knob("actor_rollout_ref.rollout.n", SEED_N,
                           "fewer samples per prompt: seed 000's n=10 cost +70 % time for little gain over 5"))
    return knobs


def _update_knobs(hint: Mapping[str, Any]) -> list[Knob]:
    knobs = []
    micro = hint.get("ppo_micro_batch_size_per_gpu")
    if isinstance(micro, int):
        knobs.append(_knob("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", micro * 2,
                           "larger micro-batches use the GPU better while memory allows (plan's estimate)"))
    mini, batch = hint.get("ppo_mini_batch_size"), hint.get("train_batch_size")
    if isinstance(mini, int) and isinstance(batch, int) and mini < batch:
        knobs.append(_knob("actor_rollout_ref.actor.ppo_mini_batch_size", min(mini * 2, batch),
                           "fewer, larger PPO updates per step (seed 000: 512 over the example's default)"))
    return knobs


def _log_prob_knobs(hint: Mapping[str, Any]) -> list[Knob]:
    micro = hint.get("log_prob_micro_batch_size_per_gpu")
    return [_knob("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", micro * 2,
                  "larger log-prob micro-batches: the pass is forward-only")] if isinstance(micro, int) else []


KNOBS = {"generation": _generation_knobs, "actor update": _update_knobs, "old log-prob": _log_prob_knobs,
         "reference": _log_prob_knobs}


def diagnose(events: Iterable[Mapping[str, Any]], hint: Mapping[str, Any] | None = None) -> Diagnosis:
    """The phase that bounds a verl step, from the run's events (runtime.metrics.parse_events) and *hint*
    (settings_hint(res))."""
    hint = dict(hint or {})
    steps = sorted((dict(e) for e in events if e.get("event") == "step"),
                   key=lambda e: e["step"] if is_number(e.get("step")) else 0)
    timed = [s for s in steps[1:] if is_number(s.get(STEP)) and s[STEP] > 0]
    ev: dict[str, Any] = {"steps": len(steps), "step_time_median_s": _median([s[STEP] for s in timed])}
    shares: dict[str, float | None] = {}
    for phase, key in PHASES.items():
        parts = [s[key] / s[STEP] for s in timed if is_number(s.get(key))]
        shares[phase] = _median(parts)
        ev[phase.replace(" ", "_").replace("-", "_") + "_share"] = shares[phase]
    ev.update(reward_first=_first(steps, "reward"), reward_last=_last(steps, "reward"),
              kl_loss_last=_last(steps, "actor/kl_loss"), grad_norm_last=_last(steps, "actor/grad_norm"),
              response_length_last=_last(steps, "completions/mean_length"),
              **{k: hint.get(k) for k in ("rollout_tp", "gpu_memory_utilization", "rollout_n",
                                          "ppo_micro_batch_size_per_gpu")})
    missing = [f"{key} (verl's per-phase timing)" for phase, key in PHASES.items() if shares[phase] is None]
    if len(timed) < MIN_STEPS:
        return Diagnosis("not enough data", f"{len(timed)} timed steps after the first; at least {MIN_STEPS} are "
                         "needed (step 1 carries vLLM's warm-up)", ev, [], missing, [])
    known = {p: v for p, v in shares.items() if v is not None}
    if not known:
        return Diagnosis("not enough data", "no per-phase timing in the events", ev, [], missing, [])
    phase, share = max(known.items(), key=lambda kv: kv[1])
    if share < BOUND_SHARE:
        return Diagnosis("balanced", f"no phase holds half of a step (the largest: {phase}, {share:.0%})", ev, [],
                         missing, [])
    side = f"{phase}-bound"
    median = ev["step_time_median_s"]
    reason = f"{phase} takes {share:.0%} of a median step ({'-' if median is None else format(median, '.2f')} s)"
    notes = []
    if phase == "generation" and not _generation_knobs(hint):
        notes.append("the seed's generation knobs are already at its values: a larger batch per step "
                     "(data.train_batch_size) spreads the fixed cost of a rollout over more samples")
    return Diagnosis(side, reason, ev, KNOBS[phase](hint), missing, notes)
