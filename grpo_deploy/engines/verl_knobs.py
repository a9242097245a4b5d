"""The verl engine's knobs as data (grpo_deploy.engines.base.TuneKnob): what `tune` tries on each side of seed 000's
bottleneck diagnosis (trainer: the PPO micro-batch or dynamic batch with its token cap, the log-prob micro-batch,
gradient checkpointing; generation: rollout tensor parallelism, its memory, rollout.n), the values verl 0.9.1 takes for
the spec's GPUs and batch, how each changes what the loss computes, and plan's what-if of two of them."""

from __future__ import annotations

from grpo_deploy.architecture import Architecture
from grpo_deploy.diagnose.verl import PHASES, SEED_GPU_MEMORY
from grpo_deploy.engines.base import GB, Resolved, TuneKnob

MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
DYNAMIC = "actor_rollout_ref.actor.use_dynamic_bsz"
TOKEN_CAP = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
LOG_PROB_MICRO = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
CHECKPOINTING = "actor_rollout_ref.model.enable_gradient_checkpointing"
TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
MEMORY = "actor_rollout_ref.rollout.gpu_memory_utilization"
N = "actor_rollout_ref.rollout.n"
VERL_TOKEN_CAP = 16384
"""verl 0.9.1's default ppo_max_token_len_per_gpu (trainer/config/actor/actor.yaml)."""
MEMORY_STEP = 0.1
"""The rollout's gpu_memory_utilization is raised by this much a trial, up to seed 000's 0.8 (0.9 ran out)."""


def _get(res: Resolved, key: str):
    """A verl setting by its dotted key (a field or a passed-through override); None when not set."""
    return res.settings.verl.overrides([key]).get(key)


def _world(res: Resolved) -> int:
    """verl's GPUs: n_gpus_per_node on each Ray node (one per host with role head or worker)."""
    return res.settings.verl.n_gpus_per_node * max(len(res.hosts_with("head") + res.hosts_with("worker")), 1)


def _mini_per_gpu(res: Resolved, n: int | None = None) -> int | None:
    """The PPO mini-batch per GPU in answers (verl normalises ppo_mini_batch_size x rollout.n over the GPUs); None
    when it does not divide."""
    verl = res.settings.verl
    answers = (verl.ppo_mini_batch_size or verl.train_batch_size) * (n or verl.rollout_n)
    return answers // _world(res) if answers % _world(res) == 0 else None


def _micro_fits(res: Resolved, micro, n: int | None = None) -> bool:
    """verl asserts that the per-GPU mini-batch is a multiple of the micro-batch (unless the batch is dynamic)."""
    mini = _mini_per_gpu(res, n)
    return bool(_get(res, DYNAMIC)) or not isinstance(micro, int) or (mini is not None and mini % micro == 0)


def _cuda(res: Resolved) -> bool:
    head = res.hosts_with("head")
    return bool(head) and res.profiles[head[0].name].accelerator == "cuda"


# ------------------------------------------------------------------ the trainer's side


def _micro_values(res: Resolved) -> tuple:
    """Twice the micro-batch while it still divides the per-GPU mini-batch; none with a dynamic batch (verl then
    splits by tokens)."""
    micro = _get(res, MICRO)
    if _get(res, DYNAMIC) or not isinstance(micro, int):
        return ()
    return (2 * micro,) if _micro_fits(res, 2 * micro) else ()


def _dynamic_values(res: Resolved) -> tuple:
    return () if _get(res, DYNAMIC) else (True,)


def _token_cap_values(res: Resolved) -> tuple:
    """Twice the token cap, with a dynamic batch only (without it verl ignores the cap)."""
    if not _get(res, DYNAMIC):
        return ()
    return (2 * (_get(res, TOKEN_CAP) or VERL_TOKEN_CAP),)


def _log_prob_values(res: Resolved) -> tuple:
    """Twice the old log-prob micro-batch, up to the step's answers per GPU; none with a dynamic batch."""
    micro, verl = _get(res, LOG_PROB_MICRO), res.settings.verl
    if _get(res, DYNAMIC) or not isinstance(micro, int):
        return ()
    return (2 * micro,) if 2 * micro <= verl.train_batch_size * verl.rollout_n // _world(res) else ()


def _checkpointing_values(res: Resolved) -> tuple:
    """Off when on; never on: that trades speed for memory."""
    return (False,) if _get(res, CHECKPOINTING) else ()


# ------------------------------------------------------------------ the generation side


def _fits_one_gpu_share(res: Resolved, tp: int) -> bool:
    """Whether 1/tp of the bf16 weights fits the rollout's pool on a GPU (plan's memory rule); unknown shape: yes."""
    if not res.architecture:
        return True
    cap = res.profiles[res.hosts_with("head")[0].name].hardware.get("memory_gb_per_gpu", 0) * GB
    return Architecture.from_dict(res.architecture).params() * 2 / tp < res.settings.verl.rollout_memory * cap


def _tp_values(res: Resolved) -> tuple:
    """Half the TP where the model still fits (seed 000: TP 4 -> 1 for a 3B model), and twice it within a node; none
    on CPU (one logical GPU)."""
    tp, per_node = res.settings.verl.rollout_tp, res.settings.verl.n_gpus_per_node
    if not _cuda(res):
        return ()
    out = [tp // 2] if tp > 1 and _fits_one_gpu_share(res, tp // 2) else []
    return tuple(out + ([2 * tp] if 2 * tp <= per_node and _world(res) % (2 * tp) == 0 else []))


def _memory_values(res: Resolved) -> tuple:
    """A step up to seed 000's 0.8; none on CPU, where vLLM sizes its KV cache from VLLM_CPU_KVCACHE_SPACE."""
    current = res.settings.verl.rollout_memory
    more = round(min(current + MEMORY_STEP, SEED_GPU_MEMORY), 2)
    return (more,) if _cuda(res) and more > current else ()


def _n_values(res: Resolved) -> tuple:
    """Half and twice the group (at least 2), where verl takes the batch: data.train_batch_size x n divisible by the
    GPUs and the per-GPU mini-batch a multiple of the micro-batch."""
    verl = res.settings.verl
    out = []
    for n in (verl.rollout_n // 2, 2 * verl.rollout_n):
        if n >= 2 and n != verl.rollout_n and (verl.train_batch_size * n) % _world(res) == 0 \
                and _mini_per_gpu(res, n) and _micro_fits(res, _get(res, MICRO), n):
            out.append(n)
    return tuple(out)


# ------------------------------------------------------------------ plan's what-if knobs (seed 000)


def _checkpointing(res):
    on = bool(_get(res, CHECKPOINTING))
    return ("on", "off", "checkpointing_off", False, 0) if on else ("off", "on", "checkpointing_off", True, 0)


def _rollout_n(res):
    n = res.settings.verl.rollout_n
    return (str(n), str(2 * n), "rollout_n_double", False, 0)


SAME_LOSS = "verl 0.9.1's token-mean divides by the global batch's tokens, not each micro-batch's: speed and memory " \
            "change, the loss does not"
TUNE_KNOBS = (
    TuneKnob("micro-batch", f"overrides.verl.{MICRO}", "trainer", _micro_values, "",
             f"larger micro-batches use the GPU better while memory allows; {SAME_LOSS}"),
    TuneKnob("dynamic-batch", f"overrides.verl.{DYNAMIC}", "trainer", _dynamic_values, "",
             f"micro-batches cut by tokens (ppo_max_token_len_per_gpu, default {VERL_TOKEN_CAP}) instead of answers: "
             f"verl's current LoRA recipe; {SAME_LOSS}"),
    TuneKnob("token-cap", f"overrides.verl.{TOKEN_CAP}", "trainer", _token_cap_values, "",
             f"more tokens in each dynamic micro-batch: fewer, fuller passes while memory allows; {SAME_LOSS}"),
    TuneKnob("log-prob-micro-batch", f"overrides.verl.{LOG_PROB_MICRO}", "trainer", _log_prob_values, "",
             "larger log-prob micro-batches: the old log-prob pass is forward-only"),
    TuneKnob("checkpointing", f"overrides.verl.{CHECKPOINTING}", "trainer", _checkpointing_values, "",
             "recomputation costs about one extra forward, if memory allows", what_if=_checkpointing,
             label="gradient checkpointing"),
    TuneKnob("rollout-tp", f"overrides.verl.{TP}", "generation", _tp_values, "",
             "a model that fits one GPU pays only communication for TP (seed 000: TP 4 -> 1, ETA 9.5 h -> 6.5 h)"),
    TuneKnob("rollout-memory", f"overrides.verl.{MEMORY}", "generation", _memory_values, "",
             "more KV cache, more sequences at once (seed 000: 0.6 left ~20 GB idle per A100, 0.9 ran out of memory)"),
    TuneKnob("rollout-n", f"overrides.verl.{N}", "generation", _n_values,
             "rollout.n is GRPO's group: each answer's advantage is taken against its n siblings, and a step trains "
             "on n x data.train_batch_size answers (loss_agg_mode weighs them)",
             "seed 000: n 5 -> 10 cost +70% time for little gain on GSM8K", what_if=_rollout_n, label="rollout n"),
)
"""verl's knobs, in the order `tune` tries them on a side; those with a what-if are plan's what-if table, in this
order."""
TUNE_SIDES = {f"{phase}-bound": "generation" if phase == "generation" else "trainer" for phase in PHASES}
"""grpo_deploy.diagnose.verl's verdicts (the phase that bounds a step) -> the side whose knobs relieve it: the
rollout's, or the trainer's passes (actor update, old log-prob, reference)."""
