"""Synthetic rollouts shaped like seed 004's, packed by TRL 1.16's own planners and collator (no model, no GPU)."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, fields
from importlib import resources
from types import SimpleNamespace

import yaml

from grpo_deploy.runtime.bench import flops
from grpo_deploy.runtime.trainer.speed import Switches

# Qwen2.5-Math-1.5B's architecture (the seed-004 recipe's model), written out so that no download is needed.
QWEN25_15B = {
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "hidden_act": "silu",
}
# Same family, small enough for a CPU test in seconds.
TINY = {**QWEN25_15B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


@dataclass(frozen=True)
class Workload:
    """Synthetic rollouts shaped like seed 004's: groups of completions sharing one prompt."""

    groups: int
    generations: int  # completions per prompt (the profile's num_generations)
    prompt_tokens: int
    completion_mean: int
    completion_max: int  # the profile's max_completion_length
    seed: int = 0


@dataclass(frozen=True)
class Profile:
    """What the bench reads from a hardware profile, so that no recipe value is restated here."""

    name: str
    lora: SimpleNamespace  # r, alpha, dropout, target_modules: what build_lora_config reads
    token_budget: int
    temperature: float
    generations: int
    completion_max: int
    speed: dict = None  # the runtime section's speed switches (trainer_speed.Switches fields) the profile sets


def _settings(name: str) -> dict:
    """A shipped profile's settings with its `extends:` parents' under them, section by section, a setting whole (the
    rule of grpo_deploy/spec/profiles.py, which validated these files; runtime/ does not import the deployer)."""
    raw = yaml.safe_load((resources.files("grpo_deploy") / "profiles" / f"{name}.yaml").read_text(encoding="utf-8"))
    parent = _settings(raw["extends"]) if raw.get("extends") else {}
    own = raw.get("settings") or {}
    return {s: {**parent.get(s, {}), **own.get(s, {})} for s in {**parent, **own}}


def load_profile(name: str) -> Profile:
    """Read the LoRA and batching settings of a hardware profile shipped with the package."""
    settings = _settings(name)
    lora, trl = ({k: v["value"] for k, v in settings[section].items()} for section in ("lora", "trl"))
    spec = SimpleNamespace(r=lora["r"], alpha=lora["alpha"], dropout=lora["dropout"],
                           target_modules=lora["target_modules"])
    runtime = {k: v["value"] for k, v in settings.get("runtime", {}).items()}
    speed = {f.name: runtime[f.name] for f in fields(Switches) if f.name in runtime}  # every switch the trainer has
    return Profile(name, spec, int(trl["token_budget"]), float(trl["temperature"]), int(trl["num_generations"]),
                   int(trl["max_completion_length"]), speed)


def seed_004_workload(profile: Profile, tiny: bool, groups: int | None = None) -> Workload:
    """16 prompts x 8 completions (128 per optimizer step, seed 004), ~160-token prompts (11 % of the baseline's
    forwarded tokens were prompts), ~1,300-token completions capped at the profile's max_completion_length."""
    if tiny:
        return Workload(groups or 2, 4, 8, 24, 48)
    return Workload(groups or 16, profile.generations, 160, 1300, profile.completion_max)


def completion_lengths(workload: Workload) -> list[int]:
    """Log-normal completion lengths (sigma 0.5) around the workload's mean, between 8 tokens and the cap."""
    rng = random.Random(workload.seed)
    sigma = 0.5
    mu = math.log(workload.completion_mean) - sigma**2 / 2
    count = workload.groups * workload.generations
    return [min(workload.completion_max, max(8, round(rng.lognormvariate(mu, sigma)))) for _ in range(count)]


def synthetic_rollouts(workload: Workload, vocab: int) -> list[dict]:
    """Samples as TRL's rollout queue hands them to the planner: ids, completion mask, old log-probs, advantage."""
    import torch

    generator = torch.Generator().manual_seed(workload.seed)
    lengths = iter(completion_lengths(workload))
    samples = []
    for group in range(workload.groups):
        prompt = torch.randint(vocab, (workload.prompt_tokens,), generator=generator)
        rewards = torch.randint(2, (workload.generations,), generator=generator).float()
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        for advantage in advantages.tolist():
            completion = torch.randint(vocab, (next(lengths),), generator=generator)
            ids = torch.cat([prompt, completion])
            mask = torch.cat([torch.zeros_like(prompt), torch.ones_like(completion)])
            old = torch.full((len(ids),), -math.log(vocab))  # a uniform policy's log-prob: ratios near 1
            samples.append({"input_ids": ids, "completion_mask": mask, "old_log_probs": old, "advantage": advantage,
                            "group_id": group, "metrics": {}})
    return samples


def microbatches(samples: list[dict], token_budget: int, pad_token_id: int = 0) -> list[dict]:
    """Pack samples with TRL's planner and collator: one sample per microbatch when `token_budget` <= 0 (packing
    off), else rows of at most `token_budget` unique tokens (packing on). The budget planner only emits a row when the
    next sample does not fit, so a sentinel of exactly `token_budget` tokens flushes the last one."""
    from trl.experimental.async_grpo.async_grpo_trainer import (
        DataCollatorForRollout,
        FixedCountBatcher,
        TokenBudgetBatcher,
    )

    metrics = defaultdict(list)
    if token_budget > 0:
        flush = dict(samples[0], input_ids=samples[0]["input_ids"].new_zeros(token_budget), group_id=-1)
        planner = TokenBudgetBatcher([*samples, flush], 1, token_budget, metrics)
    else:
        planner = FixedCountBatcher(samples, 1, 1)
    collator = DataCollatorForRollout(pad_token_id, num_processes=1, metrics=metrics, token_budget=max(token_budget, 0))
    return [collator.torch_call([rows]) for rows in planner]


def work_of(batch: dict) -> flops.Work:
    """Forwarded tokens, trained tokens and attended pairs of one collated microbatch (one row)."""
    cu_q = [int(x) for x in batch["tree_cu_seqlens_q"][0] if x >= 0]
    cu_k = [int(x) for x in batch["tree_cu_seqlens_k"][0] if x >= 0]
    trained = int((batch["token_index"] >= 0).sum())
    return flops.Work(int(batch["attention_mask"].sum()), trained, flops.causal_pairs(cu_q, cu_k))
