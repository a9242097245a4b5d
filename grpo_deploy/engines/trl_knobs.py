"""The trl-async engine's knobs as data (grpo_deploy.engines.base.TuneKnob): what `tune` tries on each side of seed
004's bottleneck diagnosis (trainer: packing, gradient checkpointing, the speed switches, more trainer processes;
generation: replicas, the in-flight cap, staleness, vLLM's batch and memory; weight sync: the sync cadence), the values
that fit the spec's hardware, how each changes what the loss computes, and plan's what-if of four of them."""

from __future__ import annotations

from grpo_deploy.diagnose.trl_async import RECIPE_TOKEN_BUDGET, RECIPE_WEIGHT_SYNC_STEPS, SPEED_KNOBS, trl_auto_inflight
from grpo_deploy.engines.base import Resolved, TuneKnob
from grpo_deploy.engines.trl_replicas import gpu_split, replica_count, server_replicas
from grpo_deploy.engines.trl_trainers import trainer_hosts, trainer_machines, trainer_processes, trainer_ranks
from grpo_deploy.runtime.trainer.speed import LORA_ELEMENTWISE_MAX_RANK

CPU_TOKEN_BUDGET = 512
"""The budget packing was measured at on the CPU rehearsal (profile cpu, reference packing_on: x0.283 step time)."""
VLLM_MEMORY_STEP = 0.05
"""vLLM's gpu_memory_utilization is raised by this much a trial, on a GPU the server has to itself."""
VLLM_MEMORY_MAX = {"cuda": 0.95, "none": 0.2}
"""The highest gpu_memory_utilization tried: on a GPU of its own vLLM's headroom; on CPU (a fraction of host RAM for
the KV cache) profile cpu's "0.1-0.2 fits a small machine"."""
SPEED_WHY = {name: why for name, _, why in SPEED_KNOBS}


def _cuda(res: Resolved) -> bool:
    return res.settings.runtime.device == "cuda"


def _speed_value(name: str):
    return next(value for key, value, _ in SPEED_KNOBS if key == name)


def _shares_memory(res: Resolved, host) -> bool:
    """Whether *host*'s server and trainer draw on one memory: a GPU both use, or unified memory."""
    split = gpu_split(res, host)
    return bool(res.profiles[host.name].hardware.get("unified_memory", False)
                or set(split.get("trainer", ())) & set(split.get("server", ())))


def _trainer_has_room(res: Resolved) -> bool:
    """Whether the trainer's memory is its own on every trainer host (host RAM on CPU; a GPU neither shared with
    vLLM nor unified): only there a larger packed row is tried (on a shared GPU plan's split already holds it)."""
    return not _cuda(res) or not any(_shares_memory(res, host) for host in trainer_hosts(res))


def _inflight(res: Resolved) -> int:
    """The in-flight cap over all replicas: the spec's (or the replicas' derived) value, else TRL's automatic one."""
    trl = res.settings.trl
    return trl.max_inflight_tasks if trl.max_inflight_tasks > 0 else trl_auto_inflight(trl, trainer_ranks(res))


# ------------------------------------------------------------------ the trainer's side


def _packing_values(res: Resolved) -> tuple:
    """Off: the field budget (16,384 on a GPU, the rehearsal's 512 on CPU), at least one answer long. On: twice the
    budget where the trainer's memory is its own."""
    trl = res.settings.trl
    need = res.settings.model.max_prompt_length + trl.max_completion_length
    budget = trl.token_budget if trl.token_budget is not None else (res.settings.vllm.max_model_len or need)
    if budget == 0:
        return (max(RECIPE_TOKEN_BUDGET if _cuda(res) else CPU_TOKEN_BUDGET, need),)
    return (2 * budget,) if _trainer_has_room(res) else ()


def _checkpointing_values(res: Resolved) -> tuple:
    """Off when on (recomputation costs about one forward); never on: that trades speed for memory."""
    return (False,) if res.settings.trl.gradient_checkpointing else ()


def _compile_values(res: Resolved) -> tuple:
    return (True,) if _cuda(res) and not res.settings.runtime.compile_layers else ()


def _elementwise_values(res: Resolved) -> tuple:
    """Only beside compile_layers (the rules refuse it alone) and for LoRA ranks the switch rewrites."""
    rt = res.settings.runtime
    fits = _cuda(res) and rt.compile_layers and res.settings.lora.r <= LORA_ELEMENTWISE_MAX_RANK
    return (True,) if fits and not rt.lora_elementwise else ()


def _base_dtype_values(res: Resolved) -> tuple:
    """bf16 needs bf16 autocast (trl.bf16, or fp16 off) on cuda."""
    trl, rt, value = res.settings.trl, res.settings.runtime, _speed_value("base_dtype")
    autocast = trl.bf16 if trl.bf16 is not None else not trl.fp16
    return (value,) if _cuda(res) and autocast and rt.base_dtype != value else ()


def _fused_values(res: Resolved) -> tuple:
    """Liger's kernels are carried by the x86_64 trainer image only (the arm64 lock has no liger_kernel)."""
    host = res.host_for("trainer")
    x86 = host is not None and "x86_64" in res.profiles[host.name].hardware.get("arch", ())
    return ("liger",) if _cuda(res) and x86 and res.settings.runtime.fused_kernels == "off" else ()


def _processes_values(res: Resolved) -> tuple:
    """Twice the processes on each trainer host (plan's what-if): on cuda only where each keeps a GPU of its own."""
    n = 2 * trainer_processes(res)
    if _cuda(res) and any(n > len(gpu_split(res, h).get("trainer", ())) for h in trainer_hosts(res)):
        return ()
    return (n,)


# ------------------------------------------------------------------ the generation side


def _replica_values(res: Resolved) -> tuple:
    """One more replica on each server host (all at the same count), where each still gets GPUs of its own, as many
    each; none with several trainer hosts (the proxy beside such a trainer is not built)."""
    servers = res.hosts_with("server")
    counts = {h.replicas or 1 for h in servers}
    if trainer_machines(res) > 1 or len(counts) != 1:
        return ()
    more = counts.pop() + 1
    for host in servers:
        gpus = gpu_split(res, host).get("server")
        if gpus is not None and (len(gpus) < more or len(gpus) % more):
            return ()
    return (more,)


def _inflight_values(res: Resolved) -> tuple:
    """Twice the cap, while the servers' batches take it (the engine refuses more than 4x max_num_seqs a replica)."""
    more = 2 * _inflight(res)
    return (more,) if more <= 4 * res.settings.vllm.max_num_seqs * replica_count(res) else ()


def _staleness_values(res: Resolved) -> tuple:
    """Twice the limit (1 from 0), while vLLM keeps that many adapters resident (max_loras derived, or large enough)."""
    more = max(2 * res.settings.trl.max_staleness, 1)
    origin = res.origins["vllm"].get("max_loras")
    derived = origin is None or origin.source == "derived"
    return (more,) if derived or (res.settings.vllm.max_loras or 0) >= more + 2 else ()


def _seqs_values(res: Resolved) -> tuple:
    """Up to the requests in flight per replica: vLLM never batches more than it is sent."""
    seqs = res.settings.vllm.max_num_seqs
    per_replica = -(-_inflight(res) // replica_count(res))
    return (min(2 * seqs, per_replica),) if per_replica > seqs else ()


def _vllm_memory_values(res: Resolved) -> tuple:
    """A step up on a GPU the server has to itself, or on CPU; none where vLLM's share is the trainer's loss (a shared
    or unified GPU: plan's split)."""
    current = res.settings.vllm.gpu_memory_utilization
    kinds = set()
    for host in res.hosts_with("server"):
        if _shares_memory(res, host):
            return ()
        kinds.add(res.profiles[host.name].accelerator)
    top = min(VLLM_MEMORY_MAX.get(kind, VLLM_MEMORY_MAX["none"]) for kind in kinds or {"none"})
    more = round(min(current + VLLM_MEMORY_STEP, top), 2)
    return (more,) if more > current else ()


# ------------------------------------------------------------------ the weight-sync side


def _sync_values(res: Resolved) -> tuple:
    every = res.settings.trl.weight_sync_steps
    return (max(2 * every, RECIPE_WEIGHT_SYNC_STEPS),)


# ------------------------------------------------------------------ plan's what-if knobs (seed 004)


def _packing(res):
    budget = res.settings.trl.token_budget
    return ("on", "off", "packing_on", True, 0) if budget else ("off", "on", "packing_on", False, 0)


def _checkpointing(res):
    on = res.settings.trl.gradient_checkpointing
    return ("on", "off", "checkpointing_off", False, 0) if on else ("off", "on", "checkpointing_off", True, 0)


def _replicas(res):
    n = replica_count(res)
    replicas = server_replicas(res)
    per = len(replicas[0].gpus) if replicas else 0
    return (str(n), str(n + 1), "replica_added", False, per)


def _trainer_processes(res):
    n = res.engine_info.trainer_processes(res)
    cuda = res.settings.runtime.device == "cuda"
    return (str(n), str(2 * n), "trainer_processes_double", False, n if cuda else 0)


STALE = "the importance ratio corrects for them, but the further off-policy, the lower the learning rate that stays " \
        "stable"
TUNE_KNOBS = (
    TuneKnob("packing", "overrides.trl.token_budget", "trainer", _packing_values,
             "packing on or off switches the loss between per-answer and per-token weighting (TRL 1.16 divides each "
             "microbatch by its own tokens: seed 004, trl #7206), and the budget sets the answers a step trains on",
             "fwd/bwd 21.9 -> 5.6 s a step on an H200, +22% samples/h on a Spark (seed 004)",
             what_if=_packing, label="packing (trl.token_budget)"),
    TuneKnob("checkpointing", "overrides.trl.gradient_checkpointing", "trainer", _checkpointing_values, "",
             "recomputation costs about one extra forward: +40% on a Spark, 5.6 -> 4.6 s on an H200 (seed 004), if "
             "memory allows", what_if=_checkpointing, label="gradient checkpointing"),
    TuneKnob("compile", "overrides.runtime.compile_layers", "trainer", _compile_values, "",
             SPEED_WHY["compile_layers"]),
    TuneKnob("lora-elementwise", "overrides.runtime.lora_elementwise", "trainer", _elementwise_values, "",
             SPEED_WHY["lora_elementwise"]),
    TuneKnob("base-bf16", "overrides.runtime.base_dtype", "trainer", _base_dtype_values, "", SPEED_WHY["base_dtype"]),
    TuneKnob("liger", "overrides.runtime.fused_kernels", "trainer", _fused_values, "",
             "Liger's Triton RMSNorm/SwiGLU/RoPE kernels: one H200 5.73 -> 5.55 s a step alone, slower under compile "
             "(3.54 -> 3.86 s)"),
    TuneKnob("replicas", "hosts[server].replicas", "generation", _replica_values, "",
             "another vLLM server behind the kit's replica proxy, the in-flight cap scaled with it (HF's third "
             "replica removed the generation bottleneck)", what_if=_replicas, label="server replicas"),
    TuneKnob("inflight", "overrides.trl.max_inflight_tasks", "generation", _inflight_values, "",
             "more requests in flight keep vLLM's batch full (HF run 5: 384 over 3 replicas); staleness rises with it"),
    TuneKnob("staleness", "overrides.trl.max_staleness", "generation", _staleness_values,
             f"rollouts from older policies train the policy instead of being dropped: {STALE}",
             "fewer rollouts dropped as stale: generation runs further ahead of the trainer"),
    TuneKnob("max-num-seqs", "overrides.vllm.max_num_seqs", "generation", _seqs_values, "",
             "vLLM batches at most max_num_seqs sequences; requests beyond that wait in its queue"),
    TuneKnob("vllm-memory", "overrides.vllm.gpu_memory_utilization", "generation", _vllm_memory_values, "",
             "a larger KV cache holds more sequences at once (on CPU: a fraction of host RAM)"),
    TuneKnob("sync-every", "overrides.trl.weight_sync_steps", "weight-sync", _sync_values,
             f"between syncs rollouts come from a policy up to weight_sync_steps steps older (staleness is counted in "
             f"syncs): {STALE}", "fewer adapter syncs cut their share of the wall clock in proportion (HF: 4 steps)"),
    # last: plan's what-if table keeps the order it printed (packing, checkpointing, replicas, trainer processes)
    TuneKnob("trainer-processes", "overrides.runtime.trainer_processes", "trainer", _processes_values,
             "each process trains per_device_train_batch_size x gradient_accumulation_steps answers a step: twice "
             "the processes train twice the answers per optimizer step at the same learning rate",
             "FSDP2 splits each step over the processes (on cuda one GPU each; on CPU each needs cores of its own)",
             what_if=_trainer_processes, label="trainer processes"),
)
"""trl-async's knobs, in the order `tune` tries them on a side; those with a what-if are plan's what-if table, in
this order."""
TUNE_SIDES = {"trainer-bound": "trainer", "generation-bound": "generation", "sync-bound": "weight-sync"}
"""grpo_deploy.diagnose.trl_async's verdicts -> the side whose knobs relieve it."""
