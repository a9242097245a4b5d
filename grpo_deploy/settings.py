"""Typed run settings: one model per section (model, lora, data, trl, vllm, verl, runtime, checkpoints) whose fields
hold the one default, the type and a description. Profiles, spec fields and overrides are all validated against them;
the trainer-side sections (lora, runtime, trl) are the trainer config's own (grpo_deploy.runtime.config)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from .runtime.config import (
    KIT_OWNED_TRL,
    AsyncGrpoArgs,
    LoraSettings,
    Reward,
    RuntimeSettings,
    Scalar,
    Strict,
    did_you_mean,
)
from .runtime.data import DATASETS
from .runtime.values import (
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


# vLLM flags the kit renders from settings: in extra_args they are refused, with the setting to change instead.
VLLM_OWNED_FLAGS = {
    "--model": "model.path", "--served-model-name": "model.served_name", "--host": "(the kit listens on all "
    "container interfaces and publishes one address)", "--port": "overrides.vllm.port",
    "--dtype": "overrides.vllm.dtype", "--enable-lora": "(always on)",
    "--max-lora-rank": "overrides.vllm.max_lora_rank",
    "--max-loras": "overrides.vllm.max_loras", "--max-cpu-loras": "overrides.vllm.max_cpu_loras",
    "--logprobs-mode": "(TRL needs processed_logprobs)", "--generation-config": "(the kit sets vllm)",
    "--max-model-len": "overrides.vllm.max_model_len",
    "--gpu-memory-utilization": "overrides.vllm.gpu_memory_utilization",
    "--max-num-seqs": "overrides.vllm.max_num_seqs", "--tensor-parallel-size": "(one GPU per server)",
    "--data-parallel-size": "(one GPU per server)", "-tp": "(one GPU per server)", "-dp": "(one GPU per server)",
    "--seed": "run.seed",
    "--enforce-eager": "overrides.vllm.enforce_eager",
    "--enable-prefix-caching": "overrides.vllm.enable_prefix_caching",
    "--no-enable-prefix-caching": "overrides.vllm.enable_prefix_caching",
    "--max-num-batched-tokens": "overrides.vllm.max_num_batched_tokens",
    "--load-format": "overrides.vllm.load_format", "--kv-cache-dtype": "overrides.vllm.kv_cache_dtype",
    "--swap-space": "overrides.vllm.swap_space",
}


def _vllm_arg(value: str) -> str:
    """An extra server argument, never one of the kit's flags however vLLM would read it: `--flag=value` and
    `--flag value` (one item), `--max_model_len` (vLLM reads '_' as '-'), and a prefix argparse would expand."""
    flag = re.split(r"[=\s]", value.strip(), maxsplit=1)[0]
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")
    owned = flag if flag in VLLM_OWNED_FLAGS else next(
        (f for f in VLLM_OWNED_FLAGS if len(flag) > 3 and flag.startswith("--") and f.startswith(flag)), None)
    if owned:
        why = VLLM_OWNED_FLAGS[owned]
        fix = f"remove it {why}" if why.startswith("(") else f"set {why} instead"
        raise ValueError(f"{value.strip()!r} is read by vLLM as {owned}, which the kit renders; {fix}")
    return value


VllmArg = Annotated[Text, Field(min_length=1), AfterValidator(_vllm_arg)]


class VllmSettings(Strict):
    """The vLLM OpenAI server (trl-async's server role)."""

    gpu_memory_utilization: Finite = Field(0.9, gt=0, le=1)
    """Fraction of GPU memory vLLM takes (on CPU: of host RAM for the KV cache)."""
    max_num_seqs: Count = 256
    """Sequences batched at once."""
    dtype: Literal["auto", "bfloat16", "float16", "float32", "half"] = "auto"
    """Weights and activations dtype; the same as the trainer's keeps the importance ratio at 1."""
    extra_args: list[VllmArg] = []
    """More server flags, one list item per argument (never one the kit renders)."""
    max_loras: Count | None = None
    """Adapters resident at once; null = max_staleness + 2 (what TRL keeps loaded)."""
    max_lora_rank: Literal[VLLM_LORA_RANKS] | None = None
    """The LoRA rank slot; null = the smallest slot >= lora.r."""
    max_cpu_loras: Count | None = None
    """Adapters cached on the CPU; null = max_loras."""
    max_model_len: Count | None = None
    """Context length; null = max_prompt_length + max_completion_length."""
    enforce_eager: bool = False
    """Disable CUDA graphs."""
    port: Port = SERVER_PORT
    """The server's port inside its container and where it is published."""
    enable_prefix_caching: bool | None = None
    """Prefix caching; null = vLLM's default."""
    max_num_batched_tokens: Count | None = None
    """Tokens per engine step; null = vLLM's default."""
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] | None = None
    """KV cache dtype; null = vLLM's default."""
    swap_space: Finite | None = Field(None, ge=0)
    """GiB of CPU swap per GPU; null = vLLM's default."""
    load_format: Literal["auto", "safetensors", "pt", "dummy"] | None = None
    """How weights are loaded; null = vLLM's default."""
    env: dict[EnvName, EnvValue] = {}
    """Extra server environment (never credentials: those come from the caller's environment at start)."""


# verl 0.9.1 keys the kit sets from other settings, or that older docs use but the pinned verl rejects.
VERL_OWNED = {
    "trainer.save_total_limit": "verl 0.9.1 has no trainer.save_total_limit (Hydra: 'Could not override'); "
    "set checkpoints.keep, rendered as trainer.max_actor_ckpt_to_keep",
    "trainer.max_actor_ckpt_to_keep": "set checkpoints.keep instead (one place for retention)",
    "trainer.save_freq": "set checkpoints.save_every instead",
    "trainer.default_local_dir": "set checkpoints.dir instead",
    "trainer.resume_mode": "set checkpoints.resume instead",
    "trainer.nnodes": "set by the kit: one Ray node per host with role head or worker",
}
VERL_PREFIXES = ("algorithm.", "data.", "actor_rollout_ref.", "trainer.", "reward_model.", "critic.", "ray_kwargs.",
                 "custom_reward_function.", "+")
_HYDRA_VALUE = Scalar | list[Scalar] | None


class VerlSettings(BaseModel):
    """verl 0.9.1 Hydra overrides (dotted keys). The fields below are the ones the kit reads; any other key under
    verl's config groups may be given and is passed through."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True, populate_by_name=True,
                              use_attribute_docstrings=True)

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

        adapter = TypeAdapter(_HYDRA_VALUE, config=ConfigDict(strict=True))
        for key, value in (self.model_extra or {}).items():
            try:
                TypeAdapter(HydraKey).validate_python(key)
            except ValidationError:
                raise ValueError(f"{key}: not a Hydra key (dotted identifiers, optionally prefixed by + or ++)") \
                    from None
            if not key.lstrip("+").startswith(tuple(p for p in VERL_PREFIXES if p != "+")):
                raise ValueError(f"{key}: not a verl config key (expected one under "
                                 f"{', '.join(p.rstrip('.') for p in VERL_PREFIXES if p != '+')})")
            try:
                adapter.validate_python(value)
            except ValidationError:
                raise ValueError(f"{key}: expected a number, a boolean, a string or a list of those, got {value!r}") \
                    from None
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


SECTIONS: dict[str, type[BaseModel]] = {
    "model": ModelSettings, "lora": LoraSettings, "data": DataSettings, "trl": AsyncGrpoArgs, "vllm": VllmSettings,
    "verl": VerlSettings, "runtime": RuntimeSettings, "checkpoints": CheckpointSettings,
}
# Keys a user may not set in overrides.<section>, with what to set instead.
OWNED: dict[str, dict[str, str]] = {
    "trl": {k: f"set by the kit from {v}; set that instead" for k, v in KIT_OWNED_TRL.items()},
    "verl": VERL_OWNED,
}


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
