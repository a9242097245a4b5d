"""The packed GRPO step that `bench trainer` and its speed rows time: the LoRA policy as AsyncGRPOTrainer builds it,
TRL's compute_loss on one microbatch, the timed forward+backward over a step, and its summary row."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import defaultdict
from types import SimpleNamespace

from grpo_deploy.runtime.bench import flops
from grpo_deploy.runtime.bench.synthetic_rollouts import Profile, work_of
from grpo_deploy.runtime.trainer import speed as trainer_speed
from grpo_deploy.runtime.trainer.config import build_lora_config


def build_policy(arch: dict | None, model_path: str | None, profile: Profile, checkpointing: bool, device: str,
                 switches: trainer_speed.Switches | None = None, autocast: bool | None = None):
    """The policy as AsyncGRPOTrainer builds it: fp32 master weights, TRL's tree attention, fused log-prob head, PEFT
    LoRA from the profile, and (when asked) activation checkpointing with input gradients, as TRL enables it; then
    the speed switches (trainer_speed.py), none by default."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config
    from trl.experimental.async_grpo.packing import TREE_ATTENTION, register_tree_attention
    from trl.trainer.utils import add_fused_lm_head, create_model_from_path

    register_tree_attention()
    torch.manual_seed(0)
    if model_path:
        model = create_model_from_path(model_path, device_map=None, attn_implementation=TREE_ATTENTION).to(device)
    else:
        with torch.device(device):
            config = Qwen2Config(**arch)
            model = AutoModelForCausalLM.from_config(config, attn_implementation=TREE_ATTENTION, dtype=torch.float32)
    add_fused_lm_head(model, temperature=profile.temperature, outputs=("log_probs", "entropy"))
    model = get_peft_model(model, build_lora_config(SimpleNamespace(lora=profile.lora)))
    if checkpointing:
        enable = getattr(model.base_model.model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable()
        else:  # transformers < 5.20 names it gradient_checkpointing_enable
            model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    if switches is not None:
        trainer_speed.apply(model, switches, device, device == "cuda" if autocast is None else autocast)
    return model


def trl_loss_state(microbatches_per_step: int, device: str) -> SimpleNamespace:
    """Everything `AsyncGRPOTrainer.compute_loss` reads from `self`, with the config's own clipping defaults."""
    from accelerate import Accelerator
    from trl.experimental.async_grpo import AsyncGRPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(AsyncGRPOConfig)}
    epsilon = defaults["epsilon"]
    return SimpleNamespace(
        epsilon_low=epsilon,
        epsilon_high=defaults["epsilon_high"] if defaults["epsilon_high"] is not None else epsilon,
        accelerator=Accelerator(cpu=device == "cpu"),
        current_gradient_accumulation_steps=microbatches_per_step,
        aux_loss_enabled=False,
        router_aux_loss_coef=0.0,
        _metrics={"train": defaultdict(list)},
        _step_forward_tokens=0.0,
        _step_trained_tokens=0.0,
        _step_seq_len_weighted=0.0,
        _step_samples=0.0,
        _step_forward_s=0.0,
    )


def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def train_microbatch(model, state, batch: dict, device: str, autocast: bool | None = None):
    """One TRL microbatch: its compute_loss under bf16 autocast (TRL's bf16=True default; on CUDA unless told
    otherwise), then backward; returns the loss, detached."""
    import contextlib

    import torch
    from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer

    inputs = {key: value.to(device) if torch.is_tensor(value) else value for key, value in batch.items()}
    enabled = device == "cuda" if autocast is None else autocast
    context = torch.autocast(device, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()
    with context:
        loss = AsyncGRPOTrainer.compute_loss(state, model, inputs)
    loss.backward()
    return loss.detach()


def measure(model, batches: list[dict], device: str, warmup: int = 2) -> dict:
    """Seconds and peak memory of forward+backward over `batches`, after `warmup` untimed microbatches."""
    import torch

    state = trl_loss_state(len(batches), device)
    graphs_before = trainer_speed.graphs_compiled()
    started = time.perf_counter()
    for batch in batches[:warmup]:
        train_microbatch(model, state, batch, device)
    model.zero_grad(set_to_none=True)
    _synchronize(device)
    warmup_s = time.perf_counter() - started
    graphs_warm = trainer_speed.graphs_compiled()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    marks = [_mark(device)]
    started = marks[0][0]  # the first span starts where the step does: the spans never add up past the step
    for batch in batches:
        train_microbatch(model, state, batch, device)
        marks.append(_mark(device))
    _synchronize(device)
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    # Compile seconds: the warm-up's wall time beyond what the same microbatches take once compiled.
    steady = seconds * sum(_tokens(b) for b in batches[:warmup]) / max(sum(_tokens(b) for b in batches), 1)
    return {"seconds": seconds, "peak_gib": peak, "warmup_s": warmup_s, "compile_s": max(warmup_s - steady, 0.0),
            "graphs_warmup": graphs_warm - graphs_before,
            "recompiles_in_step": trainer_speed.graphs_compiled() - graphs_warm, **microbatch_spans(marks)}


def _mark(device: str) -> tuple:
    """The host clock and, on CUDA, an event on the current stream: where one microbatch ends and the next begins."""
    import torch

    event = None
    if device == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
    return time.perf_counter(), event


def microbatch_spans(marks: list[tuple]) -> dict:
    """Seconds of each timed microbatch between consecutive marks (after the closing synchronize): `host_microbatch_s`
    by the host clock (when Python had queued it), `microbatch_s` by the device's events (CUDA; else the host's). A
    slow step is then one slow microbatch (a hiccup) or all of them (a slower machine or path)."""
    host = [b[0] - a[0] for a, b in itertools.pairwise(marks)]
    events = bool(marks) and marks[0][1] is not None
    device = [a[1].elapsed_time(b[1]) / 1e3 for a, b in itertools.pairwise(marks)] if events else host
    return {"microbatch_s": device, "host_microbatch_s": host}


def _tokens(batch: dict) -> int:
    return int(batch["attention_mask"].sum())


def summarise(name: str, budget: int, checkpointing: bool, batches: list[dict], timing: dict, shape, rank: int,
              samples: int, peak: float | None) -> dict:
    """One configuration's row: throughput, memory, and MFU on the three FLOP conventions (flops.py)."""
    works = [work_of(b) for b in batches]
    work = flops.Work(*(sum(getattr(w, f) for w in works) for f in ("forwarded", "trained", "pairs")))
    seconds = timing["seconds"]
    counts = {"model": flops.model_flops(shape, work), "lora": flops.lora_flops(shape, work, rank),
              "trl": flops.trl_flops(shape, work, samples)}
    row = {"config": name, "token_budget": budget, "gradient_checkpointing": checkpointing,
           "microbatches": len(batches), "samples": samples, "forwarded_tokens": work.forwarded,
           "trained_tokens": work.trained, "attention_pairs": work.pairs, "seconds": seconds,
           "tokens_per_s": work.forwarded / seconds, "trained_tokens_per_s": work.trained / seconds,
           "samples_per_hour": samples / seconds * 3600, "peak_gib": timing["peak_gib"],
           "tflops_model": counts["model"] / seconds / 1e12}
    for key, count in counts.items():
        row[f"mfu_{key}"] = flops.mfu(count, seconds, peak) if peak else None
    return row
