"""The trl-async engine's rendered arguments and config: vLLM's argument lines (each setting's flag, the kit's own
flags), the values its templates read, and the trainer's config (grpo_deploy.runtime.trainer.config's schema)."""

from __future__ import annotations

from typing import Any

from grpo_deploy.engines.base import Engine, Resolved
from grpo_deploy.engines.trl_replicas import server_url
from grpo_deploy.engines.trl_trainers import trainer_machines, trainer_processes
from grpo_deploy.runtime.trainer.config import RunConfig, SpeedSwitches
from grpo_deploy.settings import SECTIONS, VLLM_KIT_FLAGS, KitFlag, vllm_flags


def vllm_context(res: Resolved) -> dict[str, Any]:
    ctx = res.settings.vllm.model_dump()
    ctx["env"] = dict(sorted(ctx["env"].items()))
    return ctx


def server_arg_lines(res: Resolved, listen: tuple[str, int] | None = None) -> list[str]:
    """vLLM's arguments, one per line: each VllmSettings field's flag in field order (grpo_deploy.settings declares
    them), each of the kit's own flags just before the field it names, then extra_args as given. *listen* (host,
    port) replaces the values of --host and --port: a Kubernetes server pod binds vLLM to loopback behind its front
    (grpo_deploy.engines.trl_replicas.pod_vllm_port)."""
    vllm, lines = res.settings.vllm, []
    for name, flag in vllm_flags().items():
        lines += [arg for kit in VLLM_KIT_FLAGS if kit.before == name for arg in _kit_args(res, kit, listen)]
        lines += flag.args(listen[1] if listen is not None and name == "port" else getattr(vllm, name))
    return lines + list(vllm.extra_args)


def _kit_args(res: Resolved, kit: KitFlag, listen: tuple[str, int] | None = None) -> list[str]:
    """A kit flag's lines: its value read from its setting (run.* from the spec, the rest from the settings), else
    its fixed value, else the bare flag; --host is *listen*'s host when given."""
    if listen is not None and kit.name == "--host":
        return [kit.name, listen[0]]
    value = kit.value
    if kit.setting is not None:
        section, key = kit.setting.split(".")
        value = getattr(getattr(res.settings if section in SECTIONS else res.spec, section), key)
    return [kit.name] if value is None else [kit.name, str(value)]


def trainer_config(engine: Engine, res: Resolved, publish_ips: dict[str, str] | None = None) -> RunConfig:
    """The trainer entrypoint's config (grpo_deploy.runtime.trainer.config's schema, validated here as in the
    container); async_grpo goes to TRL's AsyncGRPOConfig."""
    s, spec = res.settings, res.spec
    kit = {"output_dir": res.checkpoint_dir, "vllm_server_base_url": server_url(res, publish_ips),
           "seed": spec.run.seed,
           "report_to": _report_to(spec.logger.kind), "vllm_server_timeout": s.trl.vllm_server_timeout}
    if spec.logger.kind != "none" and s.trl.run_name is None:
        kit["run_name"] = spec.run.name
    if s.runtime.device == "cpu":
        kit.update(use_cpu=True, bf16=False)
    elif s.trl.bf16 is None and not s.trl.fp16:
        kit["bf16"] = True
    grpo = dict(sorted({**s.trl.model_dump(exclude_unset=True), **kit}.items()))
    lora = s.lora.model_dump(exclude_unset=True)
    return RunConfig.model_validate({
        "run_name": spec.run.name,
        "seed": spec.run.seed,
        "model": s.model.path,
        "dataset": {"name": s.data.dataset, "path": s.data.path, "num_prompts": s.data.num_prompts},
        "rewards": list(s.data.rewards),
        "lora": {k: lora[k] for k in ("r", "alpha", "dropout", "target_modules") if k in lora},
        "attention_shim": s.runtime.attention_shim,
        "response_template": s.runtime.response_template,
        "device": s.runtime.device,
        "metrics_path": f"{res.run_dir}/metrics.jsonl",
        "adapters": {"dir": res.checkpoint_dir, "keep": res.adapter_slots},
        "resume": s.checkpoints.resume,
        "unload_stale_adapters": True,
        "disk_watchdog": engine.disk_watchdog(res),
        "watch": engine.watch(res),
        **({"speed": speed} if (speed := _speed(res)) else {}),
        **({"processes": n} if (n := trainer_processes(res)) > 1 else {}),
        **({"machines": m} if (m := trainer_machines(res)) > 1 else {}),
        "async_grpo": grpo,
    })


def _speed(res: Resolved) -> dict:
    """The trainer's speed switches the profile turns on (none: today's path, and no `speed` key in trainer.yaml)."""
    default = SpeedSwitches()
    return {name: getattr(res.settings.runtime, name) for name in SpeedSwitches.model_fields
            if getattr(res.settings.runtime, name) != getattr(default, name)}


def _report_to(kind: str) -> str:
    return {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow"}.get(kind, "none")
