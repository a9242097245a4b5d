"""Typed run settings: one model per section (model, lora, data, trl, vllm, verl, runtime, checkpoints) whose fields
hold the one default, the type and a description (vllm's also their server flag). Profiles, spec fields and overrides
are all validated against them; the trainer-side sections (lora, runtime, trl) are the trainer config's own
(grpo_deploy.runtime.trainer.config)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from grpo_deploy.common.shown import did_you_mean, shown, shown_key
from grpo_deploy.common.strict import Strict
from grpo_deploy.common.values import (
    MAX_DISK_GB,
    MAX_STEPS,
    AbsPath,
    Count,
    EnvName,
    EnvValue,
    Finite,
    HydraKey,
    ModelRef,
    NonNegative,
    OwnPath,
    Port,
    Resume,
    ServedName,
    Text,
)
from grpo_deploy.runtime.tasks.data import DATASETS
from grpo_deploy.runtime.trainer.config import (
    KIT_OWNED_TRL,
    AsyncGrpoArgs,
    LoraSettings,
    Reward,
    RuntimeSettings,
    pass_through,
)

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
SERVER_PORT = 8000


class ModelSettings(Strict):
    """The base model."""

    path: ModelRef
    """A hub id (Qwen/Qwen2.5-Math-1.5B) or an absolute path inside the containers."""
    served_name: ServedName | None = None
    """The name the vLLM server lists in /v1/models; null = model.path."""
    max_prompt_length: Count = 512
    """Prompt tokens the server and trainer make room for."""


class DataSettings(Strict):
    """Training prompts and rewards."""

    dataset: Literal[DATASETS]
    """brevity (synthetic) | boxed-math | gsm8k."""
    rewards: list[Reward] = Field(min_length=1)
    """Reward functions by registered name."""
    num_prompts: NonNegative = 0
    """Prompts used; 0 = every prompt."""
    path: AbsPath | None = None
    """The dataset file inside the containers (boxed-math, gsm8k)."""


def _vllm_arg(value: str) -> str:
    """An extra server argument, never one of the kit's flags however vLLM would read it: `--flag=value` and
    `--flag value` (one item), `--max_model_len` (vLLM reads '_' as '-'), and a prefix argparse would expand."""
    flag = re.split(r"[=\s]", value.strip(), maxsplit=1)[0]
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")
    owned = flag if flag in VLLM_OWNED_FLAGS else next(
        (f for f in VLLM_OWNED_FLAGS if len(flag) > 3 and flag.startswith("--") and f.startswith(flag)), None)
    if flag in VLLM_GONE_FLAGS:
        raise ValueError(f"{shown(value.strip())} is read as {flag}, which is gone: {VLLM_GONE_FLAGS[flag]}; "
                         "remove the "
                         "argument")
    if owned:
        why = VLLM_OWNED_FLAGS[owned]
        fix = f"remove it {why}" if why.startswith("(") else f"set {why} instead"
        raise ValueError(f"{shown(value.strip())} is read by vLLM as {owned}, which the kit renders; {fix}")
    return value


VllmArg = Annotated[Text, Field(min_length=1), AfterValidator(_vllm_arg)]


@dataclass(frozen=True)
class VllmFlag:
    """How a VllmSettings field reaches vLLM's command line. kind "value": the flag, then the value on the next line;
    "switch" (a boolean whose false is vLLM's default): the flag when true; "toggle": the flag when true, its --no-
    form when false. Null renders nothing (vLLM's own default). *aliases*: other spellings vLLM reads as this flag."""

    name: str
    kind: Literal["value", "switch", "toggle"] = "value"
    aliases: tuple[str, ...] = ()

    @property
    def negation(self) -> str:
        return "--no-" + self.name.removeprefix("--")

    def args(self, value: Any) -> list[str]:
        """The argument lines for *value*."""
        if value is None or (value is False and self.kind == "switch"):
            return []
        if self.kind == "value":
            return [self.name, str(value)]
        return [self.name if value else self.negation]

    def spellings(self) -> tuple[str, ...]:
        """Every flag vLLM reads as this one (vLLM gives each boolean a --no- form)."""
        return (self.name, *((self.negation,) if self.kind != "value" else ()), *self.aliases)


@dataclass(frozen=True)
class NotAFlag:
    """A VllmSettings field that is no vLLM flag: *why* says where it goes instead."""

    why: str


@dataclass(frozen=True)
class KitFlag:
    """A vLLM flag the kit always renders that no VllmSettings field holds, rendered just before the flag of the
    VllmSettings field *before*. Its value is read from *setting* (a dotted key: the one to change instead), or is
    *value* (None: a bare flag), fixed by the kit for *why*. *aliases*: other spellings vLLM reads as this flag."""

    name: str
    before: str
    setting: str | None = None
    value: str | None = None
    why: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def instead(self) -> str:
        """What a user who passes this flag in extra_args does instead: set a key, or "(why the kit fixes it)"."""
        return self.setting or f"({self.why})"


class VllmSettings(Strict):
    """The vLLM OpenAI server (trl-async's server role). Each field declares its vLLM flag (rendered in field order,
    grpo_deploy.render) or why it is none."""

    port: Annotated[Port, VllmFlag("--port")] = SERVER_PORT
    """The server's port inside its container and where it is published."""
    dtype: Annotated[Literal["auto", "bfloat16", "float16", "float32", "half"], VllmFlag("--dtype")] = "auto"
    """Weights and activations dtype; the same as the trainer's keeps the importance ratio at 1."""
    max_lora_rank: Annotated[Literal[VLLM_LORA_RANKS] | None, VllmFlag("--max-lora-rank")] = None
    """The LoRA rank slot; null = the smallest slot >= lora.r."""
    max_loras: Annotated[Count | None, VllmFlag("--max-loras")] = None
    """Adapters resident at once; null = max_staleness + 2 (what TRL keeps loaded)."""
    max_cpu_loras: Annotated[Count | None, VllmFlag("--max-cpu-loras")] = None
    """Adapters cached on the CPU; null = max_loras."""
    max_model_len: Annotated[Count | None, VllmFlag("--max-model-len")] = None
    """Context length; null = max_prompt_length + max_completion_length."""
    gpu_memory_utilization: Annotated[Finite, VllmFlag("--gpu-memory-utilization",
                                                       aliases=("--device-memory-utilization",))] = \
        Field(0.9, gt=0, le=1)
    """Fraction of GPU memory vLLM takes (on CPU: of host RAM for the KV cache)."""
    max_num_seqs: Annotated[Count, VllmFlag("--max-num-seqs")] = 256
    """Sequences batched at once."""
    enforce_eager: Annotated[bool, VllmFlag("--enforce-eager", "switch")] = False
    """Disable CUDA graphs."""
    enable_prefix_caching: Annotated[bool | None, VllmFlag("--enable-prefix-caching", "toggle")] = None
    """Prefix caching; null = vLLM's default."""
    max_num_batched_tokens: Annotated[Count | None, VllmFlag("--max-num-batched-tokens")] = None
    """Tokens per engine step; null = vLLM's default."""
    load_format: Annotated[Literal["auto", "safetensors", "pt", "dummy"] | None, VllmFlag("--load-format")] = None
    """How weights are loaded; null = vLLM's default."""
    kv_cache_dtype: Annotated[Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] | None,
                              VllmFlag("--kv-cache-dtype")] = None
    """KV cache dtype; null = vLLM's default."""
    extra_args: Annotated[list[VllmArg], NotAFlag("rendered as given after the kit's flags, one line per item")] = []
    """More server flags, one list item per argument (never one the kit renders)."""
    env: Annotated[dict[EnvName, EnvValue], NotAFlag("the server's environment (server.env), not its arguments")] = {}
    """Extra server environment (never credentials: those come from the caller's environment at start)."""


def vllm_declaration(name: str) -> VllmFlag | NotAFlag | None:
    """What VllmSettings field *name* declares about vLLM's command line (None: nothing, which a test refuses)."""
    return next((m for m in VllmSettings.model_fields[name].metadata if isinstance(m, (VllmFlag, NotAFlag))), None)


def vllm_flags() -> dict[str, VllmFlag]:
    """{field: its flag} for the VllmSettings fields that are vLLM flags, in field (= render) order."""
    return {name: d for name in VllmSettings.model_fields if isinstance(d := vllm_declaration(name), VllmFlag)}


# vLLM flags the kit renders that are no VllmSettings field.
VLLM_KIT_FLAGS = (
    KitFlag("--model", "port", setting="model.path"),
    KitFlag("--served-model-name", "port", setting="model.served_name"),
    KitFlag("--host", "port", value="0.0.0.0",
            why="the kit listens on all container interfaces and publishes one address"),
    KitFlag("--enable-lora", "max_lora_rank", why="always on", aliases=("--no-enable-lora",)),
    KitFlag("--logprobs-mode", "max_model_len", value="processed_logprobs", why="TRL needs processed_logprobs"),
    KitFlag("--generation-config", "max_model_len", value="vllm", why="the kit sets vllm"),
    KitFlag("--tensor-parallel-size", "enforce_eager", value="1", why="one GPU per server", aliases=("-tp",)),
    KitFlag("--data-parallel-size", "enforce_eager", value="1", why="one GPU per server", aliases=("-dp",)),
    KitFlag("--seed", "enforce_eager", setting="run.seed"),
)


def _owned_flags() -> dict[str, str]:
    """Every spelling of every flag the kit renders -> what to do instead (a key to set, or "(why)")."""
    owned = {spelling: kit.instead for kit in VLLM_KIT_FLAGS for spelling in (kit.name, *kit.aliases)}
    owned.update({spelling: f"overrides.vllm.{name}" for name, flag in vllm_flags().items()
                  for spelling in flag.spellings()})
    return owned


# vLLM flags the kit renders (from the fields and the table above): in extra_args they are refused, with what to do.
VLLM_OWNED_FLAGS = _owned_flags()
# vLLM flags the pinned server no longer has, with why: refused in extra_args, and as overrides.vllm.<key>.
VLLM_GONE_FLAGS = {
    "--swap-space": "vLLM removed --swap-space in 0.18.0 (its V1 engine never swaps to CPU) and the pinned server "
    "would refuse it",
}
VLLM_REMOVED = {flag[2:].replace("-", "_"): f"{why}; remove the key" for flag, why in VLLM_GONE_FLAGS.items()}


# verl 0.9.1 keys the kit sets from other settings, or that older docs use but the pinned verl rejects.
VERL_OWNED = {
    "trainer.save_total_limit": "verl 0.9.1 has no trainer.save_total_limit (Hydra: 'Could not override'); "
    "set checkpoints.keep, rendered as trainer.max_actor_ckpt_to_keep",
    "trainer.max_actor_ckpt_to_keep": "set checkpoints.keep instead (one place for retention)",
    "trainer.save_freq": "set checkpoints.save_every instead",
    "trainer.default_local_dir": "set checkpoints.dir instead",
    "trainer.resume_mode": "set checkpoints.resume instead",
    "trainer.nnodes": "set by the kit: one Ray node per host with role head or worker",
    "actor_rollout_ref.model.path": "set model.path instead (one model for the rollout, the actor, plan and the "
    "render)",
}
VERL_PREFIXES = ("algorithm.", "data.", "actor_rollout_ref.", "trainer.", "reward_model.", "reward.", "critic.",
                 "ray_kwargs.", "custom_reward_function.", "transfer_queue.", "+")


class VerlSettings(Strict):
    """verl 0.9.1 Hydra overrides (dotted keys). The fields below are the ones the kit reads; any other key under
    verl's config groups may be given and is passed through."""

    # Unknown keys kept, not refused: they are Hydra overrides passed through to verl (checked by the validator
    # below); fields also answer to their short names (populate_by_name). The rest of the strict config is Strict's.
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    n_gpus_per_node: Count = Field(1, alias="trainer.n_gpus_per_node")
    """GPUs per node."""
    nnodes: Count = Field(1, alias="trainer.nnodes")
    """Ray nodes (set by the kit from the hosts)."""
    rollout_tp: Count = Field(1, alias="actor_rollout_ref.rollout.tensor_model_parallel_size")
    """Rollout tensor parallelism."""
    rollout_n: Count = Field(1, alias="actor_rollout_ref.rollout.n")
    """Samples per prompt."""
    rollout_memory: Finite = Field(0.5, gt=0, le=1, alias="actor_rollout_ref.rollout.gpu_memory_utilization")
    """Fraction of each GPU for the colocated vLLM rollout."""
    train_batch_size: Count = Field(1024, alias="data.train_batch_size")
    """Prompts per step."""
    ppo_mini_batch_size: Count | None = Field(None, alias="actor_rollout_ref.actor.ppo_mini_batch_size")
    """Prompts per PPO update; null = data.train_batch_size."""
    total_epochs: Count = Field(1, le=MAX_STEPS, alias="trainer.total_epochs")
    """Passes over the dataset."""
    total_training_steps: Count | None = Field(None, le=MAX_STEPS, alias="trainer.total_training_steps")
    """Steps; null = derived from the dataset size, batch and epochs."""
    model_dtype: Literal["bf16", "bfloat16", "fp32", "float32"] | None = Field(
        None, alias="actor_rollout_ref.actor.fsdp_config.model_dtype")
    """FSDP dtype of the actor (verl's default is fp32)."""
    save_lora_only: bool | None = Field(None, alias="+actor_rollout_ref.actor.checkpoint.save_lora_only")
    """Save only the LoRA weights in a checkpoint."""

    @model_validator(mode="after")
    def _extras(self) -> VerlSettings:
        from pydantic import TypeAdapter

        for key, value in (self.model_extra or {}).items():
            try:
                TypeAdapter(HydraKey).validate_python(key)
            except ValidationError:
                raise ValueError(f"{shown_key(key)}: not a Hydra key (dotted identifiers, optionally prefixed by "
                                 "+ or ++)") \
                    from None
            if not key.lstrip("+").startswith(tuple(p for p in VERL_PREFIXES if p != "+")):
                raise ValueError(f"{shown_key(key)}: not a verl config key (expected one under "
                                 f"{', '.join(p.rstrip('.') for p in VERL_PREFIXES if p != '+')})")
            field = next((f.alias for f in type(self).model_fields.values()
                          if f.alias and f.alias.lstrip("+") == key.lstrip("+")), None)
            if field is not None:
                raise ValueError(f"{shown_key(key)}: the kit reads this key (verl would take the prefixed one and the "
                                 f"kit its own): write it as {field}")
            pass_through(key, value)
        return self

    def overrides(self, keys) -> dict[str, Any]:
        """{dotted key: value} for *keys* (in that order), known fields and passed-through keys alike."""
        data = self.model_dump(by_alias=True)
        return {key: data[key] for key in keys if key in data}


class CheckpointSettings(Strict):
    """Where checkpoints go, how many stay, when they are written and how a run resumes."""

    dir: OwnPath
    """Absolute, on the shared volume (so a resume finds it from any host)."""
    keep: Count | None = None
    """Checkpoints kept; null = every one."""
    save_every: Count | None = None
    """Optimizer steps between saves; null = never."""
    resume: Resume = "auto"
    """auto (the newest complete checkpoint) | never | an absolute checkpoint path."""
    disk_margin_gb: Finite = Field(2.0, ge=0, le=MAX_DISK_GB)
    """Free space left over at the peak of checkpoints + adapters."""
    disk_watchdog: bool = True
    """TRL: before each save, stop cleanly if free space < the next checkpoint + disk_margin_gb."""


# Passed-through keys that name a file the trainer reads: refused unless on the shared volume (spec.rules).
PATH_KEYS: dict[str, tuple[str, ...]] = {
    "trl": ("deepspeed", "fsdp_config", "accelerator_config", "logging_dir"),
    "verl": ("data.train_files", "data.val_files"),
}

# Keys a user may not set in overrides.<section>, with what to set instead.
OWNED: dict[str, dict[str, str]] = {
    "trl": {k: f"set by the kit from {v}; set that instead" for k, v in KIT_OWNED_TRL.items()},
    "verl": VERL_OWNED,
    "vllm": VLLM_REMOVED,
}


def owned_why(section: str, key: str) -> str | None:
    """What to set instead of overrides.<section>.<key>, when the kit owns the key; else None. Hydra's + and ++ add
    or force the same key, so the kit's own keys are its own under either prefix."""
    table = OWNED.get(section, {})
    return table.get(key) or table.get(key.lstrip("+"))


def known_keys(section: str) -> list[str]:
    """The keys a section names (by alias for verl), for "did you mean" and error hints."""
    cls = SECTIONS[section]
    return sorted(f.alias or name for name, f in cls.model_fields.items())


def unknown_key_hint(section: str, key: str) -> str:
    known = known_keys(section)
    return did_you_mean(key, known) or f"; allowed: {', '.join(known)}"


class Settings(BaseModel):
    """Every section, typed."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    model: ModelSettings
    lora: LoraSettings
    data: DataSettings
    trl: AsyncGrpoArgs
    vllm: VllmSettings
    verl: VerlSettings
    runtime: RuntimeSettings
    checkpoints: CheckpointSettings


SECTIONS: dict[str, type[BaseModel]] = {name: f.annotation for name, f in Settings.model_fields.items()}
"""Every section by name, in the order of Settings' fields: the one list of section names."""
OVERRIDE_SECTIONS = tuple(name for name in SECTIONS if name != "checkpoints")
"""The sections a spec's overrides may name (checkpoints are the spec's own `checkpoints:` fields)."""
