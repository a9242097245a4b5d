"""The trl-async engine's GPU memory per role, for plan and preflight's memory check: vLLM's share as vLLM sizes it, the
trainer's need (from the profile's measured peak where it applies, else a rough estimate) against what is left to it,
and for a short side one line saying by how much and one saying what to change.

vLLM (0.2x/0.3x) takes gpu_memory_utilization x the GPU's total: at start it refuses to run unless that much is free,
and its KV cache is that budget less the weights, its activation peak and (unless enforce_eager) its CUDA graphs; its
own CUDA context comes on top. So on a GPU the trainer shares, the server starts first
(grpo_deploy.deploy.bringup.trl_async) and the trainer has what is left: total x (1 - gpu_memory_utilization) less
both processes' CUDA contexts.
"""

from __future__ import annotations

import math
from typing import Any

from grpo_deploy.architecture import Architecture, known_models
from grpo_deploy.engines.base import GB, Resolved

GIB = 2**30
CUDA_CONTEXT_GB = 0.6
"""GPU memory a process's CUDA context holds outside what it allocates (an allowance, not measured here: about half a
GB with CUDA 12/13 and lazy module loading). Neither vLLM's budget nor the trainer's measured peak counts it."""
_UNSET = object()


def server(res: Resolved, arch: Architecture, cap: float, shared: bool) -> dict[str, Any]:
    """vLLM's budget on its GPU, the weights and KV cache in it, and how many full-length sequences the cache holds."""
    vllm = res.settings.vllm
    gmu, weights = vllm.gpu_memory_utilization, arch.params() * 2
    pool = gmu * cap
    kv = pool - weights
    per_seq = arch.kv_bytes_per_token() * (vllm.max_model_len or 0)
    seqs = int(kv // per_seq) if per_seq and kv > 0 else 0
    why = (f"gpu_memory_utilization {gmu:g} x {cap / GB:.0f} GB; KV cache = that less the weights, before vLLM's "
           f"activation peak{'' if vllm.enforce_eager else ' and CUDA graphs'}")
    if shared:
        why += f"; starts first: vLLM needs {pool / GB:.1f} GB free to start, the trainer starts once it is ready"
    out = {"role": "server", "budget_gb": round(pool / GB, 1), "weights_gb": round(weights / GB, 2),
           "kv_cache_gb": round(max(kv, 0) / GB, 1), "full_length_sequences": seqs, "fits": kv > 0 and seqs >= 1,
           "why": why}
    if not out["fits"]:
        need = weights + per_seq
        one = _ceil(need / cap)
        full = _ceil((weights + per_seq * vllm.max_num_seqs) / cap)
        out["short"] = (f"server is short by {(need - pool) / GB:.1f} GB: needs {need / GB:.1f} GB (weights "
                        f"{weights / GB:.1f} GB + the KV cache of one {vllm.max_model_len}-token sequence), has "
                        f"{pool / GB:.1f} GB (gpu_memory_utilization {gmu:g} x {cap / GB:.0f} GB)")
        out["fix"] = (f"raise overrides.vllm.gpu_memory_utilization to {one:g} ({full:g} holds max_num_seqs "
                      f"{vllm.max_num_seqs} full-length sequences)" if one <= 1 else
                      "the weights and one sequence do not fit this GPU: a smaller model or a shorter "
                      "max_completion_length")
    return out


def trainer(res: Resolved, arch: Architecture, profile, cap: float, with_server: bool,
            shared: list[int]) -> dict[str, Any]:
    """The trainer's need against what it has: its GPU less its CUDA context; on a GPU shared with the server, the
    part vLLM leaves less both contexts; on unified memory (or a CPU host) beside the server, the part vLLM leaves."""
    s = res.settings
    gmu = s.vllm.gpu_memory_utilization
    need, fixed, per_token, source, more = _need(res, arch, profile)
    if profile.hardware.get("unified_memory", False) and with_server or profile.accelerator == "none":
        avail, how = cap * (1 - gmu), f"{cap / GB:.0f} GB x (1 - gpu_memory_utilization {gmu:g})"
    elif shared:
        avail = cap * (1 - gmu) - 2 * CUDA_CONTEXT_GB * GB
        how = f"{cap / GB:.0f} GB x (1 - {gmu:g}) - 2 x {CUDA_CONTEXT_GB} GB CUDA contexts (vLLM's and its own)"
    else:
        avail, how = cap - CUDA_CONTEXT_GB * GB, f"its GPU's {cap / GB:.0f} GB - {CUDA_CONTEXT_GB} GB CUDA context"
    out = {"role": "trainer", "need_gb": round(need / GB, 1), "available_gb": round(avail / GB, 1),
           "fits": need <= avail, "why": f"{source}{more}; available: {how}"}
    if need > avail:
        where = f" on GPU {','.join(map(str, shared))} shared with the server" if shared else ""
        out["short"] = (f"trainer{where} is short by {(need - avail) / GB:.1f} GB: needs {need / GB:.1f} GB "
                        f"({source}), has {avail / GB:.1f} GB ({how})")
        out["fix"] = "; or ".join(_trainer_fixes(res, arch, cap, need, avail, fixed, per_token, shared))
    return out


def _trainer_fixes(res: Resolved, arch: Architecture, cap: float, need: float, avail: float, fixed: float,
                   per_token: float, shared: list[int]) -> list[str]:
    s = res.settings
    fixes = []
    if shared:
        gmu = math.floor((1 - (need + 2 * CUDA_CONTEXT_GB * GB) / cap) * 100) / 100
        per_seq = arch.kv_bytes_per_token() * (s.vllm.max_model_len or 0)
        if gmu > 0 and gmu * cap - arch.params() * 2 >= per_seq:
            fixes.append(f"lower overrides.vllm.gpu_memory_utilization to {gmu:g}")
    budget = s.trl.token_budget
    if budget and per_token:
        tokens = int((avail - fixed) // per_token) // 1024 * 1024
        if s.model.max_prompt_length + s.trl.max_completion_length <= tokens < budget:
            fixes.append(f"lower overrides.trl.token_budget to {tokens}")
    if not s.trl.gradient_checkpointing:
        fixes.append("turn on overrides.trl.gradient_checkpointing")
    if shared:
        fixes.append("give the trainer its own GPU (hosts[].gpus.trainer, or a host of its own)")
    return fixes or ["give the trainer a GPU with more memory"]


def _need(res: Resolved, arch: Architecture, profile) -> tuple[float, float, float, str, str]:
    """(bytes needed, the part that does not grow with tokens, bytes per token of the microbatch, where it came from,
    more on that): the profile's measured peak where the run matches its settings, else the rough estimate."""
    return _measured(res, arch, profile) or _rough(res, arch)


def _measured(res: Resolved, arch: Architecture, profile) -> tuple[float, float, float, str, str] | None:
    """The profile's reference trainer_peak_gib, when the run is one trainer process of the same architecture under
    the settings it was measured with; a token_budget other than the measured one scales the part above the base
    weights linearly with the tokens of a microbatch (packed rows: the activations and logits grow with them)."""
    ref = profile.reference.get("trl-async", {}).get("trainer_peak_gib")
    s = res.settings
    if ref is None or (s.runtime.trainer_processes or 1) != 1:
        return None
    at = dict(ref.at)
    measured_tokens, model = at.pop("trl.token_budget", None), at.pop("model.path", None)
    known = known_models().get(model) if model is not None else None
    if model is not None and (known is None or Architecture.from_dict(known) != arch):
        return None
    if any(getattr(getattr(s, key.split(".")[0]), key.split(".", 1)[1], _UNSET) != value for key, value in at.items()):
        return None
    budget = s.trl.token_budget
    if measured_tokens is not None and not budget:
        return None  # measured with packing: a row of token_budget tokens, not a microbatch of whole answers
    weights = arch.params() * (4 if s.runtime.base_dtype == "fp32" else 2)
    peak = ref.value * GIB
    words = f"measured: {ref.source.split(',')[0]}, {measured_tokens or budget:,} tokens, {ref.value:g} GiB"
    where = f" (profile {ref.profile} reference trainer_peak_gib; beside the CUDA context allowance)"
    if not measured_tokens or budget == measured_tokens:
        return peak, peak, 0.0, words, where
    per_token = (peak - weights) / measured_tokens
    return (weights + per_token * budget, weights, per_token,
            words + f", scaled to {budget:,} tokens", f" above the {weights / GB:.1f} GB base weights{where}")


def _rough(res: Resolved, arch: Architecture) -> tuple[float, float, float, str, str]:
    """Today's rough estimate: the bf16 weights, LoRA with its Adam state, activations and logits per token."""
    trl = res.settings.trl
    tokens = trl.token_budget or (res.settings.model.max_prompt_length + trl.max_completion_length) \
        * trl.per_device_train_batch_size
    ckpt = trl.gradient_checkpointing
    per_token = arch.num_hidden_layers * arch.hidden_size * (2 if ckpt else 34) + arch.hidden_size * 34 \
        + arch.vocab_size * 6
    fixed = arch.params() * 2 + arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules) * 16
    return (fixed + tokens * per_token, fixed, per_token, "rough estimate",
            f": weights {arch.params() * 2 / GB:.1f} GB + LoRA/optimizer + activations for {tokens} tokens per "
            f"microbatch ({'with' if ckpt else 'without'} gradient checkpointing)")


def _ceil(fraction: float) -> float:
    """A gpu_memory_utilization of at least *fraction*, to two decimals."""
    return math.ceil(round(fraction * 100, 6)) / 100
