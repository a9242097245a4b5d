"""Plan a run (pure): what runs where, memory fit, checkpoint size, the save schedule, and disk need vs free space.

Free space is an input (a fact gathered by the caller from the real filesystem, or a what-if figure), so
every number here is reproducible in tests. Estimates are labelled as such; the disk rule is exact given
the checkpoint size: while a checkpoint is written the previous `keep` still exist, so the peak is
(keep + 1) checkpoints + the adapters the server may still read + a safety margin.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .resolve import DATASET_SIZES, Resolved, as_dict, gpu_split
from .spec import ArchitectureSpec

GB = 1e9
CKPT_EXTRA_BYTES = 8 * 1024**2  # verl: tokenizer/config (huggingface/), extra state, data.pt: a few MB
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


class Architecture(ArchitectureSpec):
    """A model's shape (the spec's type) and the sizes plan derives from it."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Architecture:
        return cls(**{k: d[k] for k in cls.model_fields if k in d})

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder block (Qwen2/Llama layout)."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.num_attention_heads * self.hd, \
            self.num_key_value_heads * self.hd
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def params(self) -> int:
        per_layer = sum(a * b for a, b in self.linear_shapes().values()) + 2 * self.hidden_size
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return per_layer * self.num_hidden_layers + embed + self.hidden_size

    def lora_params(self, r: int, target_modules: Any = "all-linear") -> int:
        shapes = self.linear_shapes()
        if target_modules not in ("all-linear", None):
            names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
            shapes = {k: v for k, v in shapes.items() if k in names}
        return r * sum(a + b for a, b in shapes.values()) * self.num_hidden_layers

    def kv_bytes_per_token(self) -> int:
        """K and V of every layer, in 2-byte (bf16/fp16) elements."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.hd * 2


@dataclass
class DiskPlan:
    filesystem: str
    free_bytes: int | None
    free_source: str
    checkpoint_bytes: int
    adapter_bytes: int
    adapters_kept: int
    margin_bytes: int
    total_steps: int
    save_steps: list[int]
    keep: int | None
    peak_bytes: int
    fits: bool | None
    fails_at_save: int | None = None  # 1-based index into save_steps
    fails_at_step: int | None = None
    recommended_keep: int | None = None
    extra_needed_bytes: int | None = None
    explanation: list[str] = field(default_factory=list)


@dataclass
class RolePlan:
    host: str
    address: str
    profile: str
    roles: list[str]
    gpus: str
    memory: list[dict[str, Any]]


@dataclass
class Plan:
    run: str
    engine: str
    model: str
    params: int | None
    lora_params: int | None
    hosts: list[RolePlan]
    disk: DiskPlan | None
    settings: dict[str, dict[str, Any]]
    warnings: list[str]
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def total_steps(res: Resolved) -> int:
    s = res.settings
    if res.engine_info.server_role:
        return max(s.trl.max_steps, 0)
    if s.verl.total_training_steps:
        return s.verl.total_training_steps
    size = res.spec.dataset.size or DATASET_SIZES.get(s.data.dataset, 0)
    return (size // s.verl.train_batch_size) * s.verl.total_epochs


def save_steps(res: Resolved, steps: int) -> list[int]:
    every = res.settings.checkpoints.save_every
    if not every or every <= 0 or steps <= 0:
        return []
    out = list(range(every, steps + 1, every))
    if res.engine_info.saves_last_step and steps not in out:
        out.append(steps)  # verl also saves on the last step
    return out


def lora_tensors(res: Resolved, arch: Architecture) -> int:
    """LoRA weight tensors (A and B per targeted linear layer per block)."""
    target = res.settings.lora.target_modules
    names = arch.linear_shapes() if target in ("all-linear", None) else \
        [m for m in ([target] if isinstance(target, str) else target) if m in arch.linear_shapes()]
    return 2 * len(names) * arch.num_hidden_layers


def trl_checkpoint_parts(res: Resolved, arch: Architecture, step: int) -> dict[str, int]:
    """Bytes of each part of TRL's `checkpoint-<step>` for a PEFT LoRA run, as transformers 5 / TRL 1.16 / PEFT 0.21
    write it (measured on the rehearsal, tests/faults/test_disk_full_replay.py): the adapter, Adam's two moments, the
    tokenizer (its tokenizer.json grows with the vocabulary: ~46 B per entry for Qwen2.5, ~35 for the tiny model),
    trainer_state.json (its log_history grows ~2.8 KB per logged step), small fixed files, and one filesystem block
    of slack per file (what `du` and a full disk count)."""
    lora = arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules)
    tensors = lora_tensors(res, arch)
    logging_steps = int(getattr(res.settings.trl, "logging_steps", None) or 1)
    return {
        "adapter": lora * 4 + tensors * SAFETENSORS_HEADER_PER_TENSOR + ADAPTER_FILES_BYTES,
        "optimizer": lora * 8 + tensors * OPTIMIZER_BYTES_PER_TENSOR,
        "tokenizer": arch.vocab_size * TOKENIZER_BYTES_PER_ENTRY + TOKENIZER_FIXED_BYTES,
        "trainer_state": TRAINER_STATE_BYTES_PER_LOG * (max(step, 0) // logging_steps + 1),
        "fixed": TRL_CHECKPOINT_FIXED_BYTES,
        "block_slack": TRL_CHECKPOINT_FILES * FS_BLOCK,
    }


def adapter_dir_bytes(res: Resolved, arch: Architecture) -> int:
    """One published adapter version (`.vllm_lora/trl-policy-vN`: weights, adapter_config.json, README.md)."""
    lora = arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules)
    return lora * 4 + lora_tensors(res, arch) * SAFETENSORS_HEADER_PER_TENSOR + ADAPTER_FILES_BYTES + 3 * FS_BLOCK


def checkpoint_bytes(res: Resolved, arch: Architecture, step: int | None = None) -> tuple[int, int, list[str]]:
    """(checkpoint size, adapter size, explanation lines). TRL: the checkpoint written at *step* (default: the run's
    last step, the largest one, since trainer_state.json grows)."""
    lora = arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules)
    adapter = lora * 4  # PEFT saves the fp32 LoRA weights
    optim = lora * 8  # Adam: two fp32 moments per trainable parameter
    if not res.engine_info.adapters_on_volume:  # verl: the checkpoint holds the frozen base too
        base_bytes = 2 if res.settings.verl.model_dtype in ("bf16", "bfloat16") else 4
        base = 0 if res.settings.verl.save_lora_only else arch.params() * base_bytes
        total = base + adapter + optim + CKPT_EXTRA_BYTES
        why = [f"verl FSDP checkpoint = frozen base in {'bf16' if base_bytes == 2 else 'fp32 (model_dtype default)'} "
               f"{base / GB:.2f} GB + LoRA {adapter / GB:.3f} GB + Adam state {optim / GB:.3f} GB"]
        return total, 0, why
    parts = trl_checkpoint_parts(res, arch, total_steps(res) if step is None else step)
    total = sum(parts.values())
    why = ["TRL checkpoint = " + " + ".join(f"{name.replace('_', ' ')} {_human(b)}" for name, b in parts.items())
           + f" = {_human(total)}"]
    return total, adapter_dir_bytes(res, arch), why


def _human(n: float) -> str:
    for unit, size in (("GB", GB), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.{1 if unit != 'GB' else 2}f} {unit}"
    return f"{int(n)} B"


def plan_disk(res: Resolved, arch: Architecture, free_bytes: int | None, filesystem: str, free_source: str) -> DiskPlan:
    ckpt, adapter, why = checkpoint_bytes(res, arch)
    steps = total_steps(res)
    saves = save_steps(res, steps)
    keep = res.keep
    adapters_kept = res.adapter_slots if res.engine_info.adapters_on_volume else 0
    margin = int(res.settings.checkpoints.disk_margin_gb * GB)
    fixed = adapter * adapters_kept + margin
    # TRL checkpoints grow a little with every save (trainer_state.json's log history): each save has its own size
    sizes = [checkpoint_bytes(res, arch, step)[0] if res.engine_info.adapters_on_volume else ckpt for step in saves]

    def present_while_saving(i: int, k: int | None) -> int:  # checkpoints on disk while save i (1-based) is written
        return i if k is None else min(i - 1, k) + 1

    def bytes_while_saving(i: int, k: int | None) -> int:  # the newest of them are kept: sum their sizes
        return sum(sizes[i - present_while_saving(i, k):i])

    n_saves = len(saves)
    peak = (bytes_while_saving(n_saves, keep) if n_saves else 0) + fixed
    plan = DiskPlan(filesystem=filesystem, free_bytes=free_bytes, free_source=free_source, checkpoint_bytes=ckpt,
                    adapter_bytes=adapter, adapters_kept=adapters_kept, margin_bytes=margin, total_steps=steps,
                    save_steps=saves, keep=keep, peak_bytes=peak, fits=None, explanation=list(why))
    plan.explanation.append(
        f"{n_saves} saves over {steps} steps (every {res.settings.checkpoints.save_every}), keep "
        f"{'all' if keep is None else keep}: peak {present_while_saving(n_saves, keep) if n_saves else 0} checkpoints "
        f"while one is written + {adapters_kept} adapters + {_human(margin)} margin = {_human(peak)}")
    if free_bytes is None:
        plan.explanation.append("free space unknown: measured by preflight on the host that holds the volume")
        return plan
    plan.fits = peak <= free_bytes
    if plan.fits:
        return plan
    for i, step in enumerate(saves, start=1):
        if bytes_while_saving(i, keep) + fixed > free_bytes:
            plan.fails_at_save, plan.fails_at_step = i, step
            break
    best = int((free_bytes - fixed) // ckpt) - 1 if ckpt else None
    plan.recommended_keep = best if best is not None and best >= 1 else None
    keep_all_peak = (bytes_while_saving(n_saves, None) if n_saves else 0) + fixed
    plan.extra_needed_bytes = max(0, keep_all_peak - free_bytes)
    ordinal = {1: "1st", 2: "2nd", 3: "3rd"}.get(plan.fails_at_save or 0, f"{plan.fails_at_save}th")
    msg = (f"the run runs out of disk at the {ordinal} save (step {plan.fails_at_step}): "
           f"{_human(free_bytes)} free on {filesystem}, {_human(ckpt)} per checkpoint")
    plan.explanation.append(msg)
    if plan.recommended_keep:
        plan.explanation.append(
            f"set checkpoints.keep: {plan.recommended_keep} (the largest that fits: a save needs room for one more "
            f"checkpoint before the oldest is deleted), or add {_human(plan.extra_needed_bytes)} to keep all")
    else:
        plan.explanation.append(f"not even one checkpoint plus the next fits: add at least "
                                f"{_human(2 * ckpt + fixed - free_bytes)} or move checkpoints.dir")
    return plan


def _memory(res: Resolved, arch: Architecture | None, host) -> list[dict[str, Any]]:
    profile = res.profiles[host.name]
    hw = profile.hardware
    cap = float(hw.get("memory_gb_per_gpu") or hw.get("host_memory_gb") or 0) * GB
    out: list[dict[str, Any]] = []
    if arch is None:
        return [{"role": ",".join(host.roles), "note": "model architecture unknown: set model.architecture"}]
    weights = arch.params() * 2
    for role in host.roles:
        if role == "server":
            gmu = res.settings.vllm.gpu_memory_utilization
            pool = gmu * cap
            kv = pool - weights
            per_seq = arch.kv_bytes_per_token() * (res.settings.vllm.max_model_len or 0)
            seqs = int(kv // per_seq) if per_seq and kv > 0 else 0
            out.append({"role": "server", "budget_gb": round(pool / GB, 1), "weights_gb": round(weights / GB, 2),
                        "kv_cache_gb": round(max(kv, 0) / GB, 1), "full_length_sequences": seqs,
                        "fits": kv > 0 and seqs >= 1,
                        "why": f"gpu_memory_utilization {gmu} x {cap / GB:.0f} GB"})
        elif role == "trainer":
            trl = res.settings.trl
            tokens = trl.token_budget or (res.settings.model.max_prompt_length + trl.max_completion_length) \
                * trl.per_device_train_batch_size
            ckpt = trl.gradient_checkpointing
            per_tok = arch.num_hidden_layers * arch.hidden_size * (2 if ckpt else 34) + arch.hidden_size * 34
            act = tokens * per_tok + tokens * arch.vocab_size * 6
            lora = arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules) * 16
            need = weights + lora + act
            avail = cap
            if "server" in host.roles and hw.get("unified_memory", False) or profile.accelerator == "none":
                avail = cap * (1 - res.settings.vllm.gpu_memory_utilization)
            out.append({"role": "trainer", "estimate_gb": round(need / GB, 1), "available_gb": round(avail / GB, 1),
                        "fits": need <= avail,
                        "why": f"rough: weights {weights / GB:.1f} GB + LoRA/optimizer + activations for {tokens} "
                               f"tokens per microbatch ({'with' if ckpt else 'without'} gradient checkpointing)"})
        elif role in ("head", "worker"):
            verl = res.settings.verl
            n, gmu, tp = verl.n_gpus_per_node, verl.rollout_memory, verl.rollout_tp
            shard = arch.params() * 4 / max(n * len(res.hosts_with("head") + res.hosts_with("worker")), 1)
            out.append({"role": role, "rollout_pool_gb_per_gpu": round(gmu * cap / GB, 1),
                        "rollout_weights_gb_per_gpu": round(weights / tp / GB, 2),
                        "actor_shard_fp32_gb_per_gpu": round(shard / GB, 2), "fits": weights / tp < gmu * cap,
                        "why": f"TP={tp}: each GPU holds 1/{tp} of the bf16 weights inside the rollout pool"})
    return out


def make_plan(res: Resolved, free_bytes: int | None = None, filesystem: str = "?",
              free_source: str = "unknown") -> Plan:
    arch = Architecture.from_dict(res.architecture) if res.architecture else None
    warnings = []
    hosts = []
    for host in res.spec.hosts:
        profile = res.profiles[host.name]
        gpus = "none" if profile.accelerator == "none" else \
            "; ".join(f"{role} {','.join(map(str, ids))}" for role, ids in gpu_split(res, host).items())
        hosts.append(RolePlan(host.name, host.address, profile.name, list(host.roles), gpus, _memory(res, arch, host)))
    disk = None
    if arch is None:
        warnings.append(f"model {res.settings.model.path!r} is not in grpo_deploy/models.yaml: set model.architecture "
                        "in the spec for memory and checkpoint estimates")
    else:
        disk = plan_disk(res, arch, free_bytes, filesystem, free_source)
    ok = all(m.get("fits", True) for h in hosts for m in h.memory) and (disk is None or disk.fits is not False)
    return Plan(run=res.spec.run.name, engine=res.engine, model=res.settings.model.path,
                params=arch.params() if arch else None,
                lora_params=(arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules)
                             if arch else None),
                hosts=hosts, disk=disk, settings=as_dict(res), warnings=warnings, ok=ok)
