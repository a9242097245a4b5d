"""The trainer's config schema, one for the renderer that writes it and the container that reads it: typed sections
whose fields hold the one default, loading with key-named errors, and the builders of TRL and PEFT arguments."""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from grpo_deploy.common.shown import did_you_mean, shown, shown_key
from grpo_deploy.common.strict import Strict
from grpo_deploy.common.values import (
    MAX_STEPS,
    SECRET_WORDS,
    AbsPath,
    Count,
    Finite,
    LogSteps,
    ModelRef,
    ModuleName,
    Name,
    NonNegative,
    Resume,
    Text,
    describe_error,
    no_bool,
)
from grpo_deploy.runtime.storage.adapters import LORA_SUBDIR
from grpo_deploy.runtime.storage.disk_space import DiskWatchdogConfig
from grpo_deploy.runtime.tasks import rewards as rewards_module
from grpo_deploy.runtime.tasks.data import DatasetSpec
from grpo_deploy.runtime.trainer.processes import MAX_MACHINES, MAX_PROCESSES
from grpo_deploy.runtime.watch.config import WatchConfig

ATTENTION_SHIM_MODES = ("auto", "on", "off")
# The attention shim's backends (attention_shim.py); here so the CLI can list them without importing torch.
ATTENTION_BACKENDS = ("auto", "sdpa", "varlen", "cudnn", "flex", "fastest")
DEVICES = ("cpu", "cuda")
RESPONSE_TEMPLATES = ("chatml",)
TRL_VERSION = "1.16.0"

# The new-style transformers response template for ChatML; TRL's rollout worker parses each completion with it.
CHATML_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {"content": {"close_pattern": r"<\|im_end\|>\s*|$", "content": "text"}},
}


class ConfigError(ValueError):
    """A config file problem, phrased as file, key, what is wrong and what is allowed."""


def _reward(name: str) -> str:
    if name not in rewards_module.REWARDS:
        raise ValueError(f"{shown(name)} is not a registered reward; use one of "
                         f"{', '.join(sorted(rewards_module.REWARDS))}")
    return name


Reward = Annotated[str, AfterValidator(_reward)]
Processes = Annotated[int, BeforeValidator(no_bool), Field(ge=1, le=MAX_PROCESSES)]
Machines = Annotated[int, BeforeValidator(no_bool), Field(ge=1, le=MAX_MACHINES)]
def _not_a_big_int(value: Any) -> Any:
    """An integer past int64 is not a float either (strict floats take integers): refused, not rounded."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise ValueError("an integer past the 64-bit range")
    return value


# A value passed through to TRL or Hydra: an integer within a C int64 (what torch, numpy and OmegaConf hold), a finite
# float, text.
Scalar = bool | Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] | \
    Annotated[float, BeforeValidator(_not_a_big_int), Field(allow_inf_nan=False)] | Text
# What a passed-through TRL field or Hydra override may hold: scalars or lists of them (pass_through).
_PASS_THROUGH = TypeAdapter(Scalar | list[Scalar] | None, config=ConfigDict(strict=True))


class LoraSettings(Strict):
    """The LoRA adapter (PEFT LoraConfig), the same shape on every engine."""

    r: Count = Field(8, le=1024)
    """LoRA rank."""
    alpha: Count = 16
    """LoRA alpha (the update is scaled by alpha / r)."""
    dropout: Finite = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA input, 0 to < 1."""
    target_modules: Literal["all-linear"] | list[ModuleName] = "all-linear"
    """'all-linear', or a list of module names such as [q_proj, v_proj]."""


class RuntimeSettings(Strict):
    """How the trainer process runs inside its container."""

    device: Literal["cpu", "cuda"] = "cpu"
    """cpu (fp32, use_cpu) or cuda."""
    attention_shim: Literal["auto", "on", "off"] = "auto"
    """FlashAttention-3 stand-in for TRL's packed attention: auto installs it where FA3 is missing."""
    response_template: Literal["chatml"] | None = "chatml"
    """Chat format the rollout worker parses completions with; null leaves the tokenizer's own."""
    base_dtype: Literal["fp32", "bf16-linear", "bf16"] = "fp32"
    """Frozen base weights: fp32 master weights, bf16 decoder linears only, or every frozen weight in bf16
    (trainer_speed.py; LoRA weights stay fp32)."""
    fused_kernels: Literal["off", "liger"] = "off"
    """Liger's Triton RMSNorm/SwiGLU/RoPE kernels (CUDA, the carried liger_kernel package)."""
    compile_layers: bool = False
    """Regional torch.compile of each decoder layer, the attention shim left eager."""
    lora_elementwise: bool = False
    """LoRA's rank <= 4 products as broadcasts and sums for the compiler to fuse (needs compile_layers)."""
    trainer_processes: Processes | None = None
    """Trainer processes on each trainer host (FSDP2 under accelerate launch, sharded checkpoints; with several
    trainer hosts one group over all of them): null = 1; on cuda at most one per trainer GPU (not yet run on GPUs),
    on cpu any count (gloo)."""


@cache
def trl_fields() -> frozenset[str]:
    """AsyncGRPOConfig field names of the pinned TRL, read from the installed wheel when the list was made."""
    text = (resources.files("grpo_deploy.runtime.trainer") / "trl_config_fields.txt").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


# AsyncGRPOConfig fields the kit sets from other settings: a user changes those instead.
KIT_OWNED_TRL = {
    "output_dir": "checkpoints.dir",
    "vllm_server_base_url": "the hosts (the server's address) and overrides.vllm.port",
    "seed": "run.seed",
    "report_to": "logger.kind",
    "use_cpu": "overrides.runtime.device",
    "save_strategy": "checkpoints.save_every",
    "save_steps": "checkpoints.save_every",
    "save_total_limit": "checkpoints.keep",
    "resume_from_checkpoint": "checkpoints.resume",
}


class AsyncGrpoArgs(Strict):
    """Arguments of TRL's AsyncGRPOConfig. The fields below are the ones the kit reads or sets (their defaults are
    TRL's, except vllm_server_timeout); any other AsyncGRPOConfig field may be given and is passed through."""

    # Unknown keys kept, not refused: they are AsyncGRPOConfig fields passed through to TRL (checked by
    # _known_extras below); the rest of the strict config is Strict's.
    model_config = ConfigDict(extra="allow")

    output_dir: AbsPath | None = None
    """Where TRL writes checkpoints and adapters (set by the kit from checkpoints.dir)."""
    vllm_server_base_url: Text | None = None
    """The vLLM server the rollout worker talks to (set by the kit)."""
    vllm_server_timeout: Finite = Field(900.0, gt=0, le=7 * 86400)
    """Seconds to wait for the server at start (TRL's own default, 240 s, is shorter than a large model's load)."""
    max_steps: int = Field(-1, ge=-1, le=MAX_STEPS)
    """Optimizer steps; -1 = epoch-driven."""
    logging_steps: LogSteps | None = None
    """Steps between logs: an integer from 1, or a ratio of the run below 1 (TRL logs every ceil(max_steps * ratio))."""
    max_staleness: NonNegative = 4
    """Rollouts more than this many adapter syncs old are dropped."""
    max_completion_length: Count = 2048
    """Tokens per completion (vLLM's max_tokens)."""
    max_inflight_tasks: int = Field(-1, ge=-1, le=2**31 - 1)
    """Concurrent completion requests; -1 = TRL's automatic value."""
    queue_maxsize: Count = 1024
    """Scored samples waiting for the trainer."""
    token_budget: NonNegative | None = None
    """Packing: unique tokens per packed row (0 = off, null = the server's max_model_len)."""
    per_device_train_batch_size: Count = 8
    """Samples per microbatch (not used for batching when token_budget > 0)."""
    gradient_accumulation_steps: Count = 1
    """Microbatches per optimizer step."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass (saves memory, costs time)."""
    weight_sync_steps: Count = 1
    """Optimizer steps between adapter hand-overs to the server."""
    num_generations: Count = 8
    """Completions per prompt (the GRPO group)."""
    learning_rate: Finite = Field(1e-6, gt=0)
    """Peak learning rate."""
    bf16: bool | None = None
    """bf16 mixed precision (the kit turns it on for cuda, off for cpu)."""
    fp16: bool | None = None
    """fp16 mixed precision."""
    use_cpu: bool | None = None
    """Train on the CPU (set by the kit from runtime.device)."""
    seed: int | None = None
    """Trainer seed (set by the kit from run.seed)."""
    run_name: Text | None = None
    """Logger run name."""
    report_to: Literal["none", "wandb", "tensorboard", "mlflow"] | None = None
    """Logger (set by the kit from logger.kind)."""
    save_strategy: Literal["no", "steps", "epoch"] | None = None
    """When TRL saves (set by the kit from checkpoints.save_every)."""
    save_steps: Count | None = None
    """Steps between saves (set by the kit from checkpoints.save_every)."""
    save_total_limit: Count | None = None
    """Checkpoints kept (set by the kit from checkpoints.keep)."""

    @model_validator(mode="after")
    def _known_extras(self) -> AsyncGrpoArgs:
        for key, value in (self.model_extra or {}).items():
            if key not in trl_fields():
                raise ValueError(f"{shown_key(key)}: not an AsyncGRPOConfig field of trl {TRL_VERSION}"
                                 + did_you_mean(key, trl_fields()))
            pass_through(key, value, number=key in TRL_NUMBER_FIELDS)
        return self


# AsyncGRPOConfig fields of trl 1.16.0 that hold a number (int or float) and no field of AsyncGrpoArgs types: a YAML
# boolean given to one (an unquoted on/yes/true) would reach TRL as 1 or 0.
TRL_NUMBER_FIELDS = frozenset((
    "num_train_epochs", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
    "label_smoothing_factor", "neftune_noise_alpha", "torch_empty_cache_steps", "eval_steps", "eval_delay",
    "per_device_eval_batch_size", "eval_accumulation_steps", "data_seed", "dataloader_num_workers",
    "dataloader_prefetch_factor", "ddp_bucket_cap_mb", "ddp_timeout", "local_rank", "router_aux_loss_coef",
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tool_calling_iterations",
    "fork_threshold_tokens", "request_timeout", "weight_sync_timeout", "epsilon", "epsilon_high",
    "heartbeat_stale_after_s", "num_completions_to_print",
))


def credential_key(key: str) -> bool:
    """Whether a dotted key's last name ends in one of the kit's credential words (hub_token, wandb_api_key,
    mlflow_password; not fork_threshold_tokens or ppo_max_token_len_per_gpu)."""
    last = "_" + key.rsplit(".", 1)[-1].upper()
    return last.endswith("_CREDENTIALS") or any(last.endswith("_" + word) for word in SECRET_WORDS)


def pass_through(key: str, value: Any, *, number: bool = False) -> Any:
    """*value*, checked as one the kit passes through untouched (a TRL extra, a verl override): a Scalar, a list of
    them or None; anything else is a ValueError naming *key*. A key named like a credential (hub_token,
    ...api_key) takes no value (credentials come from the environment at start, never from a rendered file); a
    *number* key takes no boolean."""
    if value is not None and credential_key(key):
        raise ValueError(f"{shown_key(key)}: names a credential, and a value given here would be written into a "
                         "rendered file: remove the key and export the credential in the environment of "
                         "`grpo-deploy up` (HF_TOKEN and WANDB_API_KEY are passed through)")
    if number and isinstance(value, bool):
        raise ValueError(f"{shown_key(key)}: expects a number, got the boolean {shown(value)} (YAML reads unquoted "
                         "on/off/yes/no/true/false as booleans; write the number)")
    try:
        return _PASS_THROUGH.validate_python(value)
    except ValidationError:
        raise ValueError(f"{shown_key(key)}: expected a number, a boolean, a string or a list of those "
                         "(integers within 64 bits, finite floats), "
                         f"got {shown(value)}") from None


class AdapterConfig(Strict):
    dir: AbsPath | None = None
    """Holds `.vllm_lora/trl-policy-vN`; defaults to async_grpo.output_dir."""
    keep: Count | None = None
    """Adapter versions kept on the volume; defaults to max_staleness + 2."""


class SpeedSwitches(Strict):
    """The trainer's speed switches (runtime/trainer_speed.py), from the profile's runtime settings of the same names;
    all off is today's path."""

    base_dtype: Literal["fp32", "bf16-linear", "bf16"] = "fp32"
    fused_kernels: Literal["off", "liger"] = "off"
    compile_layers: bool = False
    lora_elementwise: bool = False

    @model_validator(mode="after")
    def _needs(self) -> SpeedSwitches:
        if self.lora_elementwise and not self.compile_layers:
            raise ValueError("lora_elementwise needs compile_layers (eager, its broadcasts would be materialised)")
        return self


class RunConfig(Strict):
    """The whole trainer config: what grpo_deploy.runtime.trainer.train reads from /etc/grpo-deploy/trainer.yaml."""

    run_name: Name
    seed: int = 0
    model: ModelRef
    dataset: DatasetSpec = DatasetSpec()
    rewards: list[Reward] = Field(["brevity"], min_length=1)
    lora: LoraSettings = LoraSettings()
    attention_shim: Literal["auto", "on", "off"] = "auto"
    response_template: Literal["chatml"] | None = "chatml"
    device: Literal["cpu", "cuda"] = "cpu"
    metrics_path: AbsPath
    adapters: AdapterConfig = AdapterConfig()
    resume: Resume = "auto"
    unload_stale_adapters: bool = True
    heartbeat_path: AbsPath | None = None
    disk_watchdog: DiskWatchdogConfig | None = None
    watch: WatchConfig | None = None
    """The run watcher (runtime/watch/watcher.py) on rank 0's logged steps; None: off."""
    speed: SpeedSwitches = SpeedSwitches()
    processes: Processes = 1
    """Trainer processes on each trainer host (ranks of one FSDP2 group); above 1 (or several machines) the
    entrypoint re-executes itself under accelerate."""
    machines: Machines = 1
    """Trainer hosts the group spans (each its processes); each host's place comes from its environment
    (processes.machine_from_env)."""
    async_grpo: AsyncGrpoArgs
    source: str = Field("<config>", exclude=True)

    @model_validator(mode="after")
    def _rules(self) -> RunConfig:
        if not self.async_grpo.output_dir:
            raise ValueError("async_grpo.output_dir: is required (an absolute path on the shared volume)")
        if self.dataset.name != "brevity" and not self.dataset.path:
            raise ValueError(f"dataset.path: is required for dataset {self.dataset.name}")
        if self.device == "cpu" and (self.async_grpo.bf16 or self.async_grpo.fp16):
            raise ValueError("async_grpo.bf16: mixed precision cannot be used with device: cpu")
        if self.device == "cuda" and self.async_grpo.use_cpu:
            raise ValueError("async_grpo.use_cpu: contradicts device: cuda")
        if self.speed.base_dtype != "fp32" and not self.async_grpo.bf16:
            raise ValueError(f"speed.base_dtype: {self.speed.base_dtype} needs async_grpo.bf16 (bf16 autocast)")
        if self.speed.fused_kernels != "off" and self.device != "cuda":
            raise ValueError("speed.fused_kernels: Liger's kernels need device: cuda")
        return self

    @property
    def output_dir(self) -> str:
        return os.path.abspath(self.async_grpo.output_dir)

    @property
    def world_size(self) -> int:
        """Ranks of the trainer's process group: processes on each of the machines."""
        return self.processes * self.machines

    @property
    def max_staleness(self) -> int:
        return self.async_grpo.max_staleness

    @property
    def max_completion_length(self) -> int:
        return self.async_grpo.max_completion_length

    @property
    def server_url(self) -> str:
        return str(self.async_grpo.vllm_server_base_url or "http://localhost:8000").rstrip("/")

    @property
    def lora_dir(self) -> str:
        """Where adapter versions are published: `<adapters.dir>/.vllm_lora/trl-policy-vN`, TRL's own layout."""
        return os.path.join(os.path.abspath(self.adapters.dir or self.async_grpo.output_dir), LORA_SUBDIR)


def parse_config(raw: Any, source: str = "<config>") -> RunConfig:
    """Validate a config mapping; every error names the key, the problem and what is allowed."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a YAML mapping")
    try:
        return RunConfig.model_validate({**raw, "source": source})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "literal[")))
        message = describe_error(err)
        prefix, sep, rest = message.partition(": ")
        if not key and sep and " " not in prefix:  # a model rule names its own key
            key, message = prefix, rest
        raise ConfigError(f"{source}: {key or '<top>'}: {message}") from None


def load_config(path: str) -> RunConfig:
    """Read and validate a trainer config file."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_config(raw, source=path)


def config_text(config: RunConfig, header: str) -> str:
    """The config as the YAML file the container reads (only what was set; TRL applies its own defaults)."""
    data = config.model_dump(exclude_unset=True, mode="json")
    data["async_grpo"] = dict(sorted(config.async_grpo.model_dump(exclude_unset=True, mode="json").items()))
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120)


def build_grpo_kwargs(config: RunConfig) -> dict[str, Any]:
    """`AsyncGRPOConfig` keyword arguments: what the config set in `async_grpo`, plus the device settings and run
    defaults. On CPU, transformers refuses TRL's default bf16 without a GPU, so the run is fp32 with `use_cpu`."""
    kwargs = config.async_grpo.model_dump(exclude_unset=True)
    kwargs["output_dir"] = config.output_dir
    kwargs.setdefault("vllm_server_timeout", config.async_grpo.vllm_server_timeout)
    kwargs.setdefault("run_name", config.run_name)
    kwargs.setdefault("seed", config.seed)
    if config.device == "cpu":
        kwargs.update(use_cpu=True, bf16=False, fp16=False)
    return kwargs


def build_lora_config(config: RunConfig):
    """The PEFT `LoraConfig` for the policy adapter."""
    from peft import LoraConfig

    lora = config.lora
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def response_template(name: str | None) -> dict | None:
    """The tokenizer `response_template` for a named chat format, or None to leave the tokenizer as it is."""
    if name is None:
        return None
    if name == "chatml":
        return CHATML_RESPONSE_TEMPLATE
    raise ValueError(f"unknown response template {shown(name)}")
