"""Trainer config file: loading and validation, and the pure builders that turn it into TRL/PEFT arguments."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

import yaml

from . import rewards as rewards_module
from .adapters import LORA_SUBDIR
from .data import DATASETS, DatasetSpec

ATTENTION_SHIM_MODES = ("auto", "on", "off")
DEVICES = ("cpu", "cuda")
RESPONSE_TEMPLATES = ("chatml",)

# The new-style transformers response template for ChatML; TRL's rollout worker parses each completion with it.
CHATML_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {"content": {"close_pattern": r"<\|im_end\|>\s*|$", "content": "text"}},
}


class ConfigError(ValueError):
    """A config file problem, phrased as file, key, what is wrong and what is allowed."""


@dataclass(frozen=True)
class LoraSpec:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"


@dataclass(frozen=True)
class AdapterSpec:
    dir: str | None = None  # holds `.vllm_lora/trl-policy-vN`; defaults to async_grpo.output_dir
    keep: int | None = None  # defaults to max_staleness + 2


@dataclass(frozen=True)
class RunConfig:
    run_name: str
    model: str
    metrics_path: str
    async_grpo: dict[str, Any]
    seed: int = 0
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    rewards: tuple[str, ...] = ("brevity",)
    lora: LoraSpec = field(default_factory=LoraSpec)
    attention_shim: str = "auto"
    response_template: str | None = "chatml"
    device: str = "cpu"
    adapters: AdapterSpec = field(default_factory=AdapterSpec)
    resume: str = "auto"
    unload_stale_adapters: bool = True
    heartbeat_path: str | None = None
    source: str = "<config>"

    @property
    def output_dir(self) -> str:
        return os.path.abspath(self.async_grpo["output_dir"])

    @property
    def max_staleness(self) -> int:
        return int(self.async_grpo.get("max_staleness", 4))

    @property
    def max_completion_length(self) -> int:
        return int(self.async_grpo.get("max_completion_length", 2048))

    @property
    def server_url(self) -> str:
        return str(self.async_grpo.get("vllm_server_base_url", "http://localhost:8000")).rstrip("/")

    @property
    def lora_dir(self) -> str:
        """Where adapter versions are published: `<adapters.dir>/.vllm_lora/trl-policy-vN`, TRL's own layout."""
        return os.path.join(os.path.abspath(self.adapters.dir or self.async_grpo["output_dir"]), LORA_SUBDIR)


_REQUIRED = ("run_name", "model", "metrics_path", "async_grpo")


def _fail(source: str, key: str, why: str) -> ConfigError:
    return ConfigError(f"{source}: {key}: {why}")


def _section(raw: Any, cls, source: str, key: str):
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise _fail(source, key, f"must be a mapping, got {type(raw).__name__}")
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise _fail(source, f"{key}.{unknown[0]}", f"unknown key; allowed: {', '.join(sorted(allowed))}")
    return cls(**raw)


def _expect(value: Any, kind, source: str, key: str):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _fail(source, key, f"must be {names}, got {value!r}")
    return value


def parse_config(raw: Any, source: str = "<config>") -> RunConfig:
    """Validate a config mapping; every error names the key, the problem and what is allowed."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a YAML mapping")
    allowed = {f.name for f in fields(RunConfig)} - {"source"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise _fail(source, unknown[0], f"unknown key; allowed: {', '.join(sorted(allowed))}")
    missing = [key for key in _REQUIRED if raw.get(key) in (None, "")]
    if missing:
        raise _fail(source, missing[0], "is required")

    values = dict(raw)
    _expect(values["run_name"], str, source, "run_name")
    _expect(values["model"], str, source, "model")
    _expect(values["metrics_path"], str, source, "metrics_path")
    grpo = _expect(values["async_grpo"], dict, source, "async_grpo")
    if not grpo.get("output_dir"):
        raise _fail(source, "async_grpo.output_dir", "is required (an absolute path on the shared volume)")
    values["seed"] = _expect(values.get("seed", 0), int, source, "seed")

    dataset = _section(values.get("dataset"), DatasetSpec, source, "dataset")
    if dataset.name not in DATASETS:
        raise _fail(source, "dataset.name", f"{dataset.name!r} is not one of {', '.join(DATASETS)}")
    if dataset.name != "brevity" and not dataset.path:
        raise _fail(source, "dataset.path", f"is required for dataset {dataset.name}")
    if dataset.num_prompts is not None and (not isinstance(dataset.num_prompts, int) or dataset.num_prompts < 1):
        raise _fail(source, "dataset.num_prompts", f"must be a positive integer or null, got {dataset.num_prompts!r}")
    values["dataset"] = dataset

    reward_names = values.get("rewards", ["brevity"])
    if isinstance(reward_names, str):
        reward_names = [reward_names]
    if not isinstance(reward_names, list) or not reward_names:
        raise _fail(source, "rewards", "must be a non-empty list of reward names")
    for name in reward_names:
        if name not in rewards_module.REWARDS:
            registered = ", ".join(sorted(rewards_module.REWARDS))
            raise _fail(source, "rewards", f"{name!r} is not registered; use {registered}")
    values["rewards"] = tuple(reward_names)

    values["lora"] = _section(values.get("lora"), LoraSpec, source, "lora")
    _expect(values["lora"].r, int, source, "lora.r")
    values["adapters"] = _section(values.get("adapters"), AdapterSpec, source, "adapters")
    if values["adapters"].keep is not None:
        _expect(values["adapters"].keep, int, source, "adapters.keep")

    _choice(values, "attention_shim", ATTENTION_SHIM_MODES, "auto", source)
    _choice(values, "device", DEVICES, "cpu", source)
    template = values.get("response_template", "chatml")
    if template is not None and template not in RESPONSE_TEMPLATES:
        raise _fail(source, "response_template", f"{template!r} is not one of {', '.join(RESPONSE_TEMPLATES)} or null")
    values["response_template"] = template
    resume = str(values.get("resume", "auto"))
    if resume not in ("auto", "never") and not os.path.isabs(resume):
        raise _fail(source, "resume", f"must be auto, never or an absolute checkpoint path, got {resume!r}")
    values["resume"] = resume
    unload = values.get("unload_stale_adapters", True)
    values["unload_stale_adapters"] = _expect(unload, bool, source, "unload_stale_adapters")
    return RunConfig(source=source, **values)


def _choice(values: dict, key: str, allowed: tuple[str, ...], default: str, source: str) -> None:
    value = values.get(key, default)
    if value is True and "on" in allowed:  # YAML reads a bare `on` as a boolean
        value = "on"
    if value is False and "off" in allowed:
        value = "off"
    if value not in allowed:
        raise _fail(source, key, f"{value!r} is not one of {', '.join(allowed)}")
    values[key] = value


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


def build_grpo_kwargs(config: RunConfig) -> dict[str, Any]:
    """`AsyncGRPOConfig` keyword arguments: `async_grpo` verbatim plus the device settings and run defaults.

    On CPU, transformers refuses TRL's default bf16 without a GPU, so the run is fp32 with `use_cpu`.
    """
    kwargs = dict(config.async_grpo)
    kwargs["output_dir"] = config.output_dir
    kwargs.setdefault("run_name", config.run_name)
    kwargs.setdefault("seed", config.seed)
    if config.device == "cpu":
        if kwargs.get("bf16") or kwargs.get("fp16"):
            raise _fail(config.source, "async_grpo.bf16", "mixed precision cannot be used with device: cpu")
        kwargs["use_cpu"] = True
        kwargs["bf16"] = False
        kwargs["fp16"] = False
    elif kwargs.get("use_cpu"):
        raise _fail(config.source, "async_grpo.use_cpu", "contradicts device: cuda")
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
    raise ValueError(f"unknown response template {name!r}")
