"""TRL async GRPO's bottleneck diagnosis (pure, no I/O): the trainer's own step events -> which side bounds the run
(trainer, generation, adapter sync), the figures that say so, and the next spec setting to change (the types and the
text it shares with verl's: grpo_deploy.diagnose.base).

The rules are seed 004's hand diagnosis, read from TRL 1.16's metric keys (shared/reference/trl_async_grpo.md §4):
trainer-bound = the rollout queue sits near its cap while forward/backward fills the step; generation-bound = the
trainer waits on an empty queue (`perf/rollout_wait_s`); sync-bound = adapter syncs (`perf/weight_sync_s`) take a
large share of the wall clock. A metric a rule needs that the events lack is named ("not recorded"), never guessed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from grpo_deploy.diagnose.base import (
    Diagnosis,
    Knob,
    is_number,
    mean,
    recorded,
    rounded,
    share_of,
    step_events,
    values_of,
)

SIDES = ("trainer-bound", "generation-bound", "sync-bound", "balanced", "not enough data")

# --- thresholds -------------------------------------------------------------------------------------------------
# Steps with a measured step time needed before any verdict. TRL logs no `perf/step_s` on step 1 (it is measured
# between step ends), and the first steps carry start-up costs (cold adapter sync, first LoRA generation).
MIN_TIMED_STEPS = 5
# "Near its cap": seed 004's Spark queue "sat near its cap of 512 almost the whole run" and, tuned, "refilled to
# about 475 of 512" (0.93) while trainer-bound; 0.8 keeps that verdict with margin for the queue's sawtooth.
QUEUE_NEAR_CAP = 0.8
# "Near empty": TRL's own reading (trainer comment at async_grpo_trainer.py:375-381): "an empty queue with the trainer
# waiting is generation-bound". A tenth of the cap is our reading of "empty" for a queue sampled as it is consumed.
QUEUE_NEAR_EMPTY = 0.1
# Forward/backward "dominates" the step: seed 004's Spark baseline spent ~90% of every step in it, HF's baseline
# 21.9 s of 22.9 s (96%). Above 0.6 the trainer's compute is most of the wall clock.
FWD_BWD_DOMINATES = 0.6
# The trainer "waits on rollouts": TRL's `perf/rollout_wait_s` is ~0 when trainer-bound (seed 004: "the trainer never
# waited on generation"); 15% of the wall clock blocked on an empty queue is our threshold (no field figure exists).
WAIT_BOUND_SHARE = 0.15
# Adapter syncs block the trainer and pause vLLM. HF's bucket sync (median 8.5 s every 4 steps of 22.9 s) was ~9% of
# the baseline's wall clock and nobody called that run sync-bound; at the tuned 4.8 s steps the same syncs are ~30%,
# which is where raising weight_sync_steps becomes the next lever. 0.25 sits between the two.
SYNC_BOUND_SHARE = 0.25
# The rollout worker blocked on a full queue (`rollout/backpressure_s`, pushed only when it blocks) in most steps:
# TRL's other trainer-bound sign (seed 004: ~20 s blocked per step, every step). It also covers a queue that looks
# half empty because the trainer drains stale samples from it before it samples its size (the CPU rehearsal: queue
# at 42% of its cap, worker blocked in 92% of steps, 1,440 samples dropped stale) and a cap that is not given.
BACKPRESSURE_MOST_STEPS = 0.5
# Requests in flight at their cap (`rollout/inflight` vs max_inflight_tasks): the cap binds, so raising it can help.
INFLIGHT_AT_CAP = 0.8
# Steps per window for "first" and "last" reward and completion length (as `status` does).
WINDOW = 5
# The values the field runs used when they changed a knob (seed 004 §1, §4; HF run 5).
RECIPE_TOKEN_BUDGET = 16384
RECIPE_WEIGHT_SYNC_STEPS = 4

# --- TRL 1.16 metric keys (reference/trl_async_grpo.md §4) ------------------------------------------------------
STEP_S, FWD_BWD_S, WAIT_S, SYNC_S = "perf/step_s", "perf/fwd_bwd_s", "perf/rollout_wait_s", "perf/weight_sync_s"
QUEUE, BACKPRESSURE, INFLIGHT = "sample/rollout_queue_size", "rollout/backpressure_s", "rollout/inflight"
STALENESS, DROPPED = "sample/staleness_mean", "sample/dropped_stale_total"
REWARD, LENGTH, CLIPPED = "reward", "completions/mean_length", "completions/clipped_ratio"
TRAINED_TOK_S, FORWARDED_TOK_S = "perf/trained_tok_s_wall_clock", "perf/forwarded_tok_s_fwd_bwd"
GENERATED_TOK_S, SAMPLES, MFU = "rollout/generated_tok_s", "batch/samples_per_step", "perf/mfu_fwd_bwd"
ROW_FILL = "batch/row_fill_frac"  # logged only with a token budget: packing is on
TRAINED_TOKENS = "batch/trained_tokens_per_step"
# A run is fed by its start-up backlog when vLLM needs this much longer than a step to generate a step's answers while
# the rollout queue (filled while the trainer started) runs down to under half of where it began.
BACKLOG_GAP = 1.15

# Evidence keys in display order: label, format, unit.
LABELS: dict[str, tuple[str, str, str]] = {
    "steps": ("steps read", "d", ""),
    "step_time_median_s": ("median step time", ".2f", " s"),
    "fwd_bwd_share": ("forward/backward share of step", ".0%", ""),
    "queue_fill_mean": ("mean rollout queue fill", ".1f", ""),
    "queue_cap": ("queue cap (queue_maxsize)", "d", ""),
    "queue_fill_frac": ("queue fill vs cap", ".0%", ""),
    "rollout_wait_s_mean": ("trainer waiting for rollouts", ".2f", " s/step"),
    "rollout_wait_share": ("rollout-wait share of step", ".0%", ""),
    "backpressure_steps_frac": ("steps with worker blocked on full queue", ".0%", ""),
    "backpressure_s_mean": ("mean blocked time when blocked", ".2f", " s"),
    "inflight_mean": ("mean requests in flight", ".1f", ""),
    "inflight_cap": ("in-flight cap (max_inflight_tasks)", "d", ""),
    "weight_syncs": ("adapter syncs logged", "d", ""),
    "weight_sync_median_s": ("median adapter sync", ".2f", " s"),
    "weight_sync_share": ("adapter-sync share of step", ".0%", ""),
    "staleness_mean": ("mean staleness", ".2f", " syncs"),
    "dropped_stale_total": ("dropped stale samples", "d", ""),
    "reward_first": ("reward, first steps", ".3f", ""),
    "reward_last": ("reward, last steps", ".3f", ""),
    "reward_gain_per_hour": ("reward gain per wall-clock hour", ".3f", ""),
    "completion_length_mean": ("mean completion length", ".0f", " tokens"),
    "completion_length_first": ("completion length, first steps", ".0f", " tokens"),
    "completion_length_last": ("completion length, last steps", ".0f", " tokens"),
    "truncated_frac_last": ("truncated at max length, last steps", ".0%", ""),
    "trained_tok_s": ("trained tokens/s (wall clock)", ",.0f", ""),
    "forwarded_tok_s_fwd_bwd": ("forwarded tokens/s (fwd/bwd)", ",.0f", ""),
    "generated_tok_s": ("generated tokens/s (rollout)", ",.0f", ""),
    "samples_per_hour": ("samples trained per hour", ",.0f", ""),
    "generation_floor_s": ("vLLM's time to generate a step's tokens", ".2f", " s"),
    "sustained_step_s": ("step time generation sustains", ".2f", " s"),
    "fed_by_startup_backlog": ("steps fed by the start-up queue", "", ""),
    "mfu_fwd_bwd": ("MFU (fwd/bwd)", ".1%", ""),
    "packing": ("packing (token_budget > 0)", "", ""),
    "trainer_memory_gb": ("trainer GPU memory", ".0f", " GB"),
}


# --- reading events ---------------------------------------------------------------------------------------------
def _timed(steps: list[dict]) -> tuple[list[tuple[dict, float]], bool]:
    """(step, step seconds) pairs: TRL's `perf/step_s`, else the gap between the sink's timestamps (same quantity
    with logging_steps 1). The flag says whether the fallback was used."""
    timed = [(s, float(s[STEP_S])) for s in steps if is_number(s.get(STEP_S))]
    if timed or not steps:
        return timed, False
    gaps = [(b, b["time"] - a["time"]) for a, b in zip(steps, steps[1:], strict=False)
            if is_number(a.get("time")) and is_number(b.get("time"))]
    return [(s, g) for s, g in gaps if g > 0], True


def _timed_share(timed: list[tuple[dict, float]], key: str, absent_is_zero: bool) -> float | None:
    """Sum of *key* / sum of step time over timed steps; a step without *key* counts 0 only where TRL omits it for 0."""
    pairs = [(s.get(key), t) for s, t in timed if absent_is_zero or is_number(s.get(key))]
    part = sum(float(v) for v, _ in pairs if is_number(v))
    return share_of(part, sum(t for _, t in pairs))


def _window(steps: list[dict], key: str) -> tuple[float | None, float | None]:
    """Mean of *key* over the first and the last WINDOW steps that carry it (halves of a shorter run)."""
    rows = [s for s in steps if is_number(s.get(key))]
    w = min(WINDOW, len(rows) // 2)
    return (mean(values_of(rows[:w], key)), mean(values_of(rows[-w:], key))) if w else (None, None)


def _reward_gain_per_hour(steps: list[dict]) -> float | None:
    """Least-squares slope of reward against the wall clock, per hour: how fast reward rises in real time, which
    throughput alone does not say (seed 004 section 7: measure time to reward, not samples per hour)."""
    rows = [(float(s["time"]), float(s[REWARD])) for s in steps
            if is_number(s.get(REWARD)) and is_number(s.get("time"))]
    if len({t for t, _ in rows}) < 2:
        return None
    try:
        return statistics.linear_regression([t for t, _ in rows], [r for _, r in rows]).slope * 3600
    except (OverflowError, ValueError):  # figures near the float's limit: no slope to report
        return None


# --- the figures --------------------------------------------------------------------------------------------------
def _time_figures(timed: list[tuple[dict, float]], steps: list[dict]) -> dict[str, Any]:
    times = [t for _, t in timed]
    waits = [float(s[WAIT_S]) for s, _ in timed if is_number(s.get(WAIT_S))]
    syncs = values_of(steps, SYNC_S)
    return {
        "step_time_median_s": rounded(statistics.median(times)) if times else None,
        "fwd_bwd_share": rounded(_timed_share(timed, FWD_BWD_S, False)) if recorded(steps, FWD_BWD_S) else None,
        "rollout_wait_s_mean": rounded(mean(waits)),
        "rollout_wait_share": rounded(_timed_share(timed, WAIT_S, False)) if waits else None,
        "weight_syncs": len(syncs) if recorded(steps, SYNC_S) else None,
        "weight_sync_median_s": rounded(statistics.median(syncs)) if syncs else None,
        "weight_sync_share": rounded(_timed_share(timed, SYNC_S, True)) if syncs else None,
    }


def _queue_figures(steps: list[dict], hint: Mapping[str, Any]) -> dict[str, Any]:
    fill = mean(values_of(steps, QUEUE))
    cap = hint.get("queue_maxsize")
    blocked = values_of(steps, BACKPRESSURE)
    sampled = recorded(steps, QUEUE)  # TRL's sample metrics are recorded; backpressure absent then means 0
    inflight, inflight_cap = mean(values_of(steps, INFLIGHT)), hint.get("max_inflight_tasks")
    return {
        "queue_fill_mean": rounded(fill, 1),
        "queue_cap": cap,
        "queue_fill_frac": rounded(fill / cap, 3) if fill is not None and cap else None,
        "backpressure_steps_frac": rounded(len(blocked) / len(steps), 3) if steps and (blocked or sampled) else None,
        "backpressure_s_mean": rounded(mean(blocked), 2),
        "inflight_mean": rounded(inflight, 1),
        "inflight_cap": inflight_cap,
    }


def _learning_figures(steps: list[dict]) -> dict[str, Any]:
    reward_first, reward_last = _window(steps, REWARD)
    length_first, length_last = _window(steps, LENGTH)
    _, clipped_last = _window(steps, CLIPPED)
    sampled = recorded(steps, QUEUE) or recorded(steps, STALENESS)
    return {
        "staleness_mean": rounded(mean(values_of(steps, STALENESS)), 2),
        "dropped_stale_total": (int(total) if math.isfinite(total := sum(values_of(steps, DROPPED))) else None)
        if sampled else None,
        "reward_first": rounded(reward_first),
        "reward_last": rounded(reward_last),
        "reward_gain_per_hour": rounded(_reward_gain_per_hour(steps)),
        "completion_length_mean": rounded(mean(values_of(steps, LENGTH)), 1),
        "completion_length_first": rounded(length_first, 1),
        "completion_length_last": rounded(length_last, 1),
        "truncated_frac_last": rounded(clipped_last, 3),
    }


def _throughput_figures(timed: list[tuple[dict, float]], steps: list[dict], hint: Mapping[str, Any]) -> dict:
    trained = values_of(steps, TRAINED_TOK_S)
    forwarded = values_of(steps, FORWARDED_TOK_S)
    generated = values_of(steps, GENERATED_TOK_S)
    mfu = values_of(steps, MFU)
    counted = [(float(s[SAMPLES]), t) for s, t in timed if is_number(s.get(SAMPLES))]
    per_hour = share_of(sum(n for n, _ in counted) * 3600, sum(t for _, t in counted))
    return {
        "trained_tok_s": rounded(statistics.median(trained), 1) if trained else None,
        "forwarded_tok_s_fwd_bwd": rounded(statistics.median(forwarded), 1) if forwarded else None,
        "generated_tok_s": rounded(statistics.median(generated), 1) if generated else None,
        "samples_per_hour": rounded(per_hour, 0),
        "mfu_fwd_bwd": rounded(statistics.median(mfu) / 100) if mfu else None,  # TRL logs a percentage (compute_mfu)
        "packing": _packing(steps, hint),
        "trainer_memory_gb": hint.get("trainer_memory_gb"),
    }


def _backlog_figures(steps: list[dict], step_s: float | None) -> dict[str, Any]:
    """The step time generation alone sustains (a step's trained tokens over vLLM's generated tokens per second, each
    a median) and whether the steps were fed by the queue filled during start-up: a short run on a GPU trains from
    that backlog while it lasts, so its wait for rollouts reads ~0 and its step time reads too fast (found on an H100
    and an H200: 6.98 s a step over 20 steps, the queue 755 -> 8, then 22.9 s)."""
    tokens, generated = values_of(steps[1:], TRAINED_TOKENS), values_of(steps[1:], GENERATED_TOK_S)
    floor = statistics.median(tokens) / statistics.median(generated) if tokens and generated and \
        statistics.median(generated) > 0 else None
    queue = values_of(steps[1:], QUEUE)
    draining = len(queue) >= 2 and queue[-1] < queue[0] / 2
    fed = bool(floor and step_s and math.isfinite(floor) and floor > step_s * BACKLOG_GAP and draining)
    return {"generation_floor_s": rounded(floor, 2), "queue_first": rounded(queue[0], 1) if queue else None,
            "queue_last": rounded(queue[-1], 1) if queue else None, "fed_by_startup_backlog": fed,
            "sustained_step_s": rounded(max(floor, step_s), 2) if floor and step_s else None}


def _packing(steps: list[dict], hint: Mapping[str, Any]) -> bool | None:
    """From the spec when given (token_budget 0 = off; null = the server's max_model_len, on), else from the events:
    TRL logs `batch/row_fill_frac` only with a token budget."""
    if "token_budget" in hint:
        return hint["token_budget"] != 0
    if recorded(steps, ROW_FILL):
        return True
    return False if recorded(steps, SAMPLES) else None


def _not_recorded(steps: list[dict], hint: Mapping[str, Any], derived_step_time: bool) -> list[str]:
    missing = [f"{key} ({why})" for key, why in (
        (FWD_BWD_S, "forward/backward time"), (WAIT_S, "time the trainer waited for rollouts"),
        (QUEUE, "rollout queue fill"), (SYNC_S, "adapter sync time"), (REWARD, "reward"),
        (LENGTH, "mean completion length")) if steps and not recorded(steps, key)]
    if derived_step_time:
        missing.insert(0, f"{STEP_S} (step time taken from the metrics file's timestamps instead)")
    if not hint.get("queue_maxsize"):
        missing.append("queue cap (overrides.trl.queue_maxsize: pass the spec's settings as profile_hint)")
    return missing


# --- the verdict --------------------------------------------------------------------------------------------------
def _held_back(ev: dict[str, Any]) -> list[str]:
    """What says generation is waiting on the trainer: a queue near its cap, a worker blocked on a full queue."""
    fill, blocked = ev["queue_fill_frac"], ev["backpressure_steps_frac"]
    signs = [f"the rollout queue sat at {fill:.0%} of its cap"] if fill is not None and fill >= QUEUE_NEAR_CAP else []
    if blocked is not None and blocked >= BACKPRESSURE_MOST_STEPS:
        signs.append(f"the rollout worker blocked on a full queue in {blocked:.0%} of steps"
                     + (" (queue cap not given)" if ev["queue_cap"] is None else ""))
    return signs


def _verdict(ev: dict[str, Any]) -> tuple[str, str]:
    sync, wait, fwd = ev["weight_sync_share"], ev["rollout_wait_share"], ev["fwd_bwd_share"]
    fill, blocked = ev["queue_fill_frac"], ev["backpressure_steps_frac"]
    if ev["fed_by_startup_backlog"]:
        return "generation-bound", (f"the trainer ran on rollouts queued while it started (queue {ev['queue_first']:g}"
                                    f" -> {ev['queue_last']:g}): vLLM generates a step's answers in "
                                    f"{ev['generation_floor_s']:.2f} s against a step of "
                                    f"{ev['step_time_median_s']:.2f} s, so once the queue is empty the trainer waits;"
                                    " the wait and step time measured here are the backlog's, not the run's")
    if sync is not None and sync >= SYNC_BOUND_SHARE and sync >= (wait or 0):
        return "sync-bound", (f"adapter syncs took {sync:.0%} of the wall clock (median "
                              f"{ev['weight_sync_median_s']:.2f} s each); the trainer and vLLM both stop for them")
    if wait is not None and wait >= WAIT_BOUND_SHARE and (fill is None or fill < QUEUE_NEAR_CAP):
        queue = f"queue at {fill:.0%} of its cap" if fill is not None else f"queue mean {ev['queue_fill_mean']}"
        return "generation-bound", (f"the trainer waited on rollouts for {wait:.0%} of the wall clock "
                                    f"({ev['rollout_wait_s_mean']:.2f} s a step), {queue}")
    held_back = _held_back(ev)
    if fwd is not None and wait is not None and fwd >= FWD_BWD_DOMINATES and wait < WAIT_BOUND_SHARE and held_back:
        return "trainer-bound", (f"forward/backward took {fwd:.0%} of the step, {' and '.join(held_back)}; the "
                                 f"trainer waited on rollouts {wait:.0%} of the time")
    if fwd is None or wait is None or (fill is None and blocked is None):
        return "not enough data", "the metrics a rule needs are not recorded (listed below)"
    return "balanced", (f"no side dominates: forward/backward {fwd:.0%} of the step, rollout wait {wait:.0%}, "
                        f"adapter sync {sync or 0:.0%}, queue {'-' if fill is None else format(fill, '.0%')} of cap")


def _doubled(current: Any, floor: int = 0) -> str:
    return str(max(2 * current, floor)) if isinstance(current, int) and current > 0 else "a larger value"


def _trainer_knobs(ev: dict[str, Any], hint: Mapping[str, Any]) -> list[Knob]:
    knobs = []
    if ev["packing"] is False:
        knobs.append(Knob("overrides.trl.token_budget", str(RECIPE_TOKEN_BUDGET),
                          "packing: fwd/bwd 21.9 -> 5.6 s/step on H200, +22% samples/h on a Spark; it also makes "
                          "the loss per-token, so compare reward per hour and completion length, not throughput"))
    knobs += _speed_knobs(hint.get("speed"))
    if hint.get("gradient_checkpointing", True):
        memory = ev["trainer_memory_gb"]
        known = f"the trainer GPU has {memory:g} GB; " if memory else "peak memory is not recorded; "
        knobs.append(Knob("overrides.trl.gradient_checkpointing", "false (if memory allows)",
                          f"{known}recomputation costs about one extra forward: +40% on a Spark (peak 66 GB of 128 "
                          "for 1.5B), 5.6 -> 4.6 s on H200"))
    per_host = hint.get("trainer_processes_per_host") or hint.get("trainer_processes") or 1
    machines = hint.get("trainer_machines") or 1
    hosts = f" on each of the {machines} trainer hosts" if machines > 1 else ""
    if hint.get("device") == "cpu":
        knobs.append(Knob("overrides.runtime.trainer_processes", str(per_host + 1),
                          f"more trainer processes{hosts} (FSDP2 over gloo) split each step's samples; each needs its "
                          "own cores"))
    else:
        knobs.append(Knob("hosts[].gpus.trainer", f"{per_host + 1} GPUs (one trainer process each){hosts}",
                          "FSDP2 splits each step's samples over the trainer GPUs (HF's H200 recipe: 2 trainer GPUs "
                          "beside 2 replicas); on one-GPU hosts such as a Spark, give another host the trainer role "
                          "(one process group over the trainer hosts; seed 004's next experiment: two Sparks "
                          "training, one serving)"))
    return knobs


def _generation_knobs(ev: dict[str, Any], hint: Mapping[str, Any]) -> list[Knob]:
    cap, seqs, inflight = ev["inflight_cap"], hint.get("max_num_seqs"), ev["inflight_mean"]
    at_cap = cap is None or inflight is None or inflight >= INFLIGHT_AT_CAP * cap
    seen = "" if inflight is None or cap is None else f" ({inflight:.0f} in flight of {cap})"
    raise_inflight = Knob("overrides.trl.max_inflight_tasks", _doubled(cap),
                          f"the cap on concurrent requests binds{seen}; more in flight keeps vLLM's batch full "
                          "(HF run 5: 384 over 3 replicas); staleness rises with it")
    new_cap = 2 * cap if isinstance(cap, int) and at_cap else cap
    knobs = [raise_inflight] if at_cap else []
    if isinstance(seqs, int) and isinstance(new_cap, int) and seqs < new_cap:
        knobs.append(Knob("overrides.vllm.max_num_seqs", str(new_cap),
                          f"vLLM batches at most {seqs} sequences; requests beyond that wait in its queue"))
    replicas = hint.get("replicas") or 1
    knobs.append(Knob("hosts[].replicas (or another host with roles [server])", f"{replicas + 1} replicas",
                      "HF removed this bottleneck with a third vLLM replica; the kit puts its replica proxy in front "
                      "and scales the in-flight cap with the count (raise the cap first while it binds: with 3 "
                      "replicas at the old cap the third added nothing)"))
    return knobs


def _sync_knobs(ev: dict[str, Any], hint: Mapping[str, Any]) -> list[Knob]:
    every = hint.get("weight_sync_steps")
    return [
        Knob("overrides.trl.weight_sync_steps", _doubled(every, RECIPE_WEIGHT_SYNC_STEPS),
             f"syncs take {ev['weight_sync_share']:.0%} of the wall clock; fewer of them cut that in proportion, "
             "but staleness is counted in syncs, so watch the importance ratio and dropped-stale samples"),
        Knob("storage.nfs", "a share on a fast direct link",
             "the adapter hand-off is file I/O: NFS on a direct cable synced in 0.31 s median, HF's bucket in 8.5 s"),
    ]


KNOBS = {"trainer-bound": _trainer_knobs, "generation-bound": _generation_knobs, "sync-bound": _sync_knobs}


def _notes(side: str, ev: dict[str, Any]) -> list[str]:
    notes = []
    if side == "trainer-bound":
        notes.append("not now: overrides.trl.max_inflight_tasks, overrides.vllm.max_num_seqs or more replicas: the "
                     "trainer never waits on generation (on a DGX Spark field run raising them changed nothing)")
    if ev["dropped_stale_total"]:
        notes.append(f"{ev['dropped_stale_total']} samples were dropped as stale: generation is ahead by more than "
                     "max_staleness syncs (overrides.trl.max_staleness, queue_maxsize)")
    if ev["packing"]:
        notes.append("packing is on: the loss is per-token; compare runs by reward per wall-clock hour and "
                     "completion length, not by tokens/s")
    return notes


def diagnose(events: Iterable[Mapping[str, Any]], profile_hint: Mapping[str, Any] | None = None) -> Diagnosis:
    """Name the bottleneck side from *events* (the run's metrics stream, `runtime.metrics.parse_events`).

    *profile_hint* carries what the events do not: the spec's settings (`settings_hint(res)` builds it) — keys
    queue_maxsize, max_inflight_tasks, max_num_seqs, weight_sync_steps, token_budget, gradient_checkpointing,
    trainer_memory_gb; any may be absent.
    """
    hint = dict(profile_hint or {})
    steps = step_events(events)
    timed, derived = _timed(steps)
    ev = {"steps": len(steps), **_time_figures(timed, steps), **_queue_figures(steps, hint),
          **_learning_figures(steps), **_throughput_figures(timed, steps, hint)}
    ev.update(_backlog_figures(steps, ev["step_time_median_s"]))
    missing = _not_recorded(steps, hint, derived)
    if len(timed) < MIN_TIMED_STEPS:
        reason = f"{len(timed)} timed steps; at least {MIN_TIMED_STEPS} are needed (step 1 carries no step time)"
        return Diagnosis("not enough data", reason, ev, [], missing, [])
    side, reason = _verdict(ev)
    knobs = KNOBS.get(side, lambda *_: [])(ev, hint)
    return Diagnosis(side, reason, ev, knobs, missing, _notes(side, ev))


SPEED_KNOBS = (  # bench trainer, one H200, packed 16,384, per 128 completions (docs/MEASUREMENTS.md)
    ("compile_layers", True, "regional torch.compile of each decoder layer, with lora_elementwise and a bf16 base "
                             "(one H200: 5.73 -> 3.16 s per step, MFU by TRL's formula 29 -> 53 %, ~40 s compile per "
                             "process, exact within bf16 rounding); measured on an H200 only: run `grpo-deploy bench`"),
    ("lora_elementwise", True, "LoRA's rank-1 products fused under compile (one H200: 3.58 -> 3.16 s per step)"),
    ("base_dtype", "bf16", "the frozen base in bf16 under compile (one H200: 3.90 -> 3.58 s; LoRA weights stay fp32)"),
)


def _speed_knobs(speed: Mapping[str, Any] | None) -> list[Knob]:
    """The speed switches a CUDA trainer leaves off (*speed* None on CPU): compile first, the others need it."""
    off = [(k, v, why) for k, v, why in SPEED_KNOBS if speed is not None and speed.get(k) != v]
    first = off[:1] if off and off[0][0] == "compile_layers" else off
    return [Knob(f"overrides.runtime.{k}", str(v).lower(), why) for k, v, why in first]


def trl_auto_inflight(trl, processes: int) -> int:
    """TRL's automatic max_inflight_tasks (reference §1.3): max(max_staleness, 1) x samples per step, which count
    every trainer process (*trl*: the settings' AsyncGrpoArgs)."""
    return max(trl.max_staleness, 1) * trl.per_device_train_batch_size * trl.gradient_accumulation_steps * processes


def settings_hint(res, processes: int = 1, machines: int = 1) -> dict[str, Any]:
    """The settings `diagnose` cannot read from events, from a resolved spec (grpo_deploy.spec.resolve.Resolved), the
    trainer's processes (every rank) and its hosts (the engine knows them, and adds its replica count)."""
    trl, vllm = res.settings.trl, res.settings.vllm
    trainer = res.host_for("trainer")
    hardware = res.profiles[trainer.name].hardware if trainer is not None else {}
    inflight = trl.max_inflight_tasks
    if inflight <= 0:
        inflight = trl_auto_inflight(trl, processes)
    hint = {"queue_maxsize": trl.queue_maxsize, "max_inflight_tasks": inflight, "max_num_seqs": vllm.max_num_seqs,
            "weight_sync_steps": trl.weight_sync_steps, "token_budget": trl.token_budget,
            "gradient_checkpointing": trl.gradient_checkpointing, "trainer_processes": processes,
            "trainer_processes_per_host": max(processes // max(machines, 1), 1), "trainer_machines": machines,
            "device": res.settings.runtime.device}
    runtime = res.settings.runtime
    if runtime.device == "cuda":  # the speed switches apply to a CUDA trainer only
        hint["speed"] = {k: getattr(runtime, k) for k, _, _ in SPEED_KNOBS}
    if hardware.get("memory_gb_per_gpu"):
        hint["trainer_memory_gb"] = hardware["memory_gb_per_gpu"]
    return hint
