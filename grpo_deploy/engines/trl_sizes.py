"""TRL's checkpoint sizes, part by part, as transformers 5 / TRL 1.16 / PEFT 0.21 write them (measured on the CPU
rehearsal), and the size of one adapter version the server reads: the trl-async engine's checkpoint_bytes and the
trainer's disk watchdog."""

from __future__ import annotations

import math

from grpo_deploy.architecture import Architecture
from grpo_deploy.engines.base import Resolved

# TRL checkpoint parts besides the LoRA weights and Adam state, measured on the CPU rehearsal (transformers 5.24,
# TRL 1.16, PEFT 0.21, torch 2.13): the flat 8 MiB once used here made plan and the disk watchdog overestimate a
# rehearsal checkpoint (459 KB real) 19-fold, so plan named the 1st save as the failing one where the 4th failed.
SAFETENSORS_HEADER_PER_TENSOR = 130  # JSON header entry per tensor (134,608 B file for 131,072 B of weights, 28)
OPTIMIZER_BYTES_PER_TENSOR = 900  # torch pickle of Adam's per-parameter state (285,723 B for 262,144 B of moments)
ADAPTER_FILES_BYTES = 8_000  # adapter_config.json (1.6 KB) + PEFT's README.md model card (5.2 KB)
TOKENIZER_BYTES_PER_ENTRY = 48  # tokenizer.json: Qwen2.5 7.03 MB for 151,665 entries; the tiny model 3.5 KB for 100
TOKENIZER_FIXED_BYTES = 2_000  # tokenizer_config.json, chat_template.jinja
TRAINER_STATE_BYTES_PER_LOG = 2_800  # trainer_state.json: 5,872 / 11,339 / 16,720 B at steps 2 / 4 / 6 (log every step)
TRL_CHECKPOINT_FIXED_BYTES = 32_000  # rng_state.pth 14.3 KB, training_args.bin 6 KB, scheduler.pt 1.5 KB, rollout_state
TRL_CHECKPOINT_FILES = 12
FS_BLOCK = 4096  # a file occupies whole blocks: up to one block of slack per file


def lora_tensors(res: Resolved, arch: Architecture) -> int:
    """LoRA weight tensors (A and B per targeted linear layer per block)."""
    target = res.settings.lora.target_modules
    names = arch.linear_shapes() if target in ("all-linear", None) else \
        [m for m in ([target] if isinstance(target, str) else target) if m in arch.linear_shapes()]
    return 2 * len(names) * arch.num_hidden_layers


def checkpoint_parts(res: Resolved, arch: Architecture, step: int) -> dict[str, int]:
    """Bytes of each part of TRL's `checkpoint-<step>` for a PEFT LoRA run, as transformers 5 / TRL 1.16 / PEFT 0.21
    write it (measured on the rehearsal, tests/faults/test_disk_full_replay.py): the adapter, Adam's two moments, the
    tokenizer (its tokenizer.json grows with the vocabulary: ~46 B per entry for Qwen2.5, ~35 for the tiny model),
    trainer_state.json (its log_history grows ~2.8 KB per logged step), small fixed files, and one filesystem block
    of slack per file (what `du` and a full disk count)."""
    lora = arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules)
    tensors = lora_tensors(res, arch)
    logging_steps = log_interval(res, res.engine_info.total_steps(res))
    return {
        "adapter": lora * 4 + tensors * SAFETENSORS_HEADER_PER_TENSOR + ADAPTER_FILES_BYTES,
        "optimizer": lora * 8 + tensors * OPTIMIZER_BYTES_PER_TENSOR,
        "tokenizer": arch.vocab_size * TOKENIZER_BYTES_PER_ENTRY + TOKENIZER_FIXED_BYTES,
        "trainer_state": TRAINER_STATE_BYTES_PER_LOG * (max(step, 0) // logging_steps + 1),
        "fixed": TRL_CHECKPOINT_FIXED_BYTES,
        "block_slack": TRL_CHECKPOINT_FILES * FS_BLOCK,
    }


def log_interval(res: Resolved, total_steps: int) -> int:
    """Steps between two entries of trainer_state.json's log history: trl.logging_steps (unset: every step, the
    profiles' value), where a value below 1 is a ratio of the run as TRL reads it (ceil(max_steps * ratio))."""
    every = getattr(res.settings.trl, "logging_steps", None) or 1
    if every < 1:
        return max(1, math.ceil(max(total_steps, 1) * every))
    return int(every)


def adapter_dir_bytes(res: Resolved, arch: Architecture) -> int:
    """One published adapter version (`.vllm_lora/trl-policy-vN`: weights, adapter_config.json, README.md)."""
    lora = arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules)
    return lora * 4 + lora_tensors(res, arch) * SAFETENSORS_HEADER_PER_TENSOR + ADAPTER_FILES_BYTES + 3 * FS_BLOCK
