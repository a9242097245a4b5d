"""Pure builders: a resolved spec -> every artifact of the run, as {relative path: text}. No I/O but package data
(writing a render to a folder, comparing one, reading its env files back: grpo_deploy.render_folder).

Layout of a render:
  config/            mounted read-only at /etc/grpo-deploy in every container of the run
    server.args      vLLM server arguments, one per line          (trl-async)
    server.env       server role environment (no secrets)          (trl-async)
    trainer.yaml     the trainer entrypoint's config                (trl-async)
    trainer.env      trainer role environment (no secrets)         (trl-async)
    verl-overrides.txt  Hydra overrides for verl.trainer.main_ppo   (verl)
  hosts/<host>.env   docker compose environment for that host (services to start, images, users, volume)
  hosts/<host>.gpu.yaml  compose override reserving that host's GPUs (GPU profiles only)
  k8s/params.env     values the kustomize overlays consume (images, UID/GID, mount, HF cache); grpo_deploy.render_k8s
  k8s/placement.yaml GPU node affinity of the profile (GPU profiles only)
  k8s/admin/         the run's Namespace and NFS PersistentVolume, for a cluster admin (storage.nfs only)
  resolved.json      every effective setting with its source and reason
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import jinja2
import yaml

from . import render_k8s
from .names import COMPOSE_BASE, COMPOSE_BIND, COMPOSE_NFS, project_name
from .plan import Architecture, checkpoint_bytes
from .resolve import Resolved, as_dict, gpu_split
from .runtime.config import RunConfig, SpeedSwitches, config_text
from .runtime.values import CONTROL, ENV_VALUE_FORBIDDEN, ip_literal, parse_address
from .settings import SECTIONS, VLLM_KIT_FLAGS, KitFlag, vllm_flags


class RenderError(RuntimeError):
    """A value reached a renderer that its format cannot hold (the spec types should have refused it first)."""


_CONTROL = CONTROL
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _finalize(value: Any) -> Any:
    """Every `{{ value }}` in a template: never a control character (a newline would start a new line, i.e. a new
    variable or argument)."""
    if isinstance(value, str) and _CONTROL.search(value):
        raise RenderError(f"refusing to render {value!r}: it holds a control character")
    return "" if value is None else value


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("grpo_deploy", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
    )


def _template(name: str, **context: Any) -> str:
    text = _env().get_template(name).render(**context)
    if name.endswith(".env.j2"):
        check_env_file(text, name)
    return text


def check_env_file(text: str, name: str) -> str:
    """An env file read by compose and by Kubernetes must mean the same to both: KEY=VALUE lines whose values hold
    nothing either reader treats specially ('$', quotes, '#', backslash)."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _ENV_KEY.fullmatch(key) or ENV_VALUE_FORBIDDEN & set(value):
            raise RenderError(f"{name}:{number}: refusing to render {line!r}: not a plain KEY=VALUE line")
    return text


def _vllm_context(res: Resolved) -> dict[str, Any]:
    ctx = res.settings.vllm.model_dump()
    ctx["env"] = dict(sorted(ctx["env"].items()))
    return ctx


def server_arg_lines(res: Resolved) -> list[str]:
    """vLLM's arguments, one per line: each VllmSettings field's flag in field order (grpo_deploy.settings declares
    them), each of the kit's own flags just before the field it names, then extra_args as given."""
    vllm, lines = res.settings.vllm, []
    for name, flag in vllm_flags().items():
        lines += [arg for kit in VLLM_KIT_FLAGS if kit.before == name for arg in _kit_args(res, kit)]
        lines += flag.args(getattr(vllm, name))
    return lines + list(vllm.extra_args)


def _kit_args(res: Resolved, kit: KitFlag) -> list[str]:
    """A kit flag's lines: its value read from its setting (run.* from the spec, the rest from the settings), else
    its fixed value, else the bare flag."""
    value = kit.value
    if kit.setting is not None:
        section, key = kit.setting.split(".")
        value = getattr(getattr(res.settings if section in SECTIONS else res.spec, section), key)
    return [kit.name] if value is None else [kit.name, str(value)]


def server_args(res: Resolved) -> list[str]:
    """The vLLM argument list (comments and blank lines dropped), e.g. for tests and Kubernetes."""
    text = render_files(res)["config/server.args"]
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def trainer_config(res: Resolved, publish_ips: dict[str, str] | None = None) -> RunConfig:
    """The trainer entrypoint's config (grpo_deploy.runtime.config's schema, validated here as in the container);
    async_grpo goes to TRL's AsyncGRPOConfig."""
    s, spec = res.settings, res.spec
    kit = {"output_dir": res.checkpoint_dir, "vllm_server_base_url": res.server_url_for(publish_ips),
           "seed": spec.run.seed,
           "report_to": _report_to(spec.logger.kind), "vllm_server_timeout": s.trl.vllm_server_timeout}
    if spec.logger.kind != "none" and s.trl.run_name is None:
        kit["run_name"] = spec.run.name
    if s.runtime.device == "cpu":
        kit.update(use_cpu=True, bf16=False)
    elif s.trl.bf16 is None:
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
        "disk_watchdog": _disk_watchdog(res),
        **({"speed": speed} if (speed := _speed(res)) else {}),
        "async_grpo": grpo,
    })


def _speed(res: Resolved) -> dict:
    """The trainer's speed switches the profile turns on (none: today's path, and no `speed` key in trainer.yaml)."""
    default = SpeedSwitches()
    return {name: getattr(res.settings.runtime, name) for name in SpeedSwitches.model_fields
            if getattr(res.settings.runtime, name) != getattr(default, name)}


def _disk_watchdog(res: Resolved) -> dict[str, int] | None:
    """The trainer's disk watchdog: the plan's checkpoint estimate and the margin (None when off or never saving)."""
    ck = res.settings.checkpoints
    if not ck.disk_watchdog or not ck.save_every:
        return None
    estimate = checkpoint_bytes(res, Architecture.from_dict(res.architecture))[0] if res.architecture else 0
    return {"checkpoint_bytes": int(estimate), "margin_bytes": int(ck.disk_margin_gb * 1e9)}


def _report_to(kind: str) -> str:
    return {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow"}.get(kind, "none")


def verl_overrides(res: Resolved) -> list[str]:
    """Hydra overrides for `python -m verl.trainer.main_ppo` (verl 0.9.1 key names), each value quoted for Hydra."""
    spec, s = res.spec, res.settings
    keep = res.keep
    resume = s.checkpoints.resume
    out: dict[str, Any] = {
        "actor_rollout_ref.model.path": s.model.path,
        "actor_rollout_ref.model.lora_rank": s.lora.r,
        "actor_rollout_ref.model.lora_alpha": s.lora.alpha,
        "actor_rollout_ref.model.target_modules": s.lora.target_modules,
        "data.max_prompt_length": s.model.max_prompt_length,
        "data.train_files": s.data.path or f"{spec.storage.mount}/data/{s.data.dataset}/train.parquet",
        "data.val_files": f"{spec.storage.mount}/data/{s.data.dataset}/test.parquet",
        "trainer.default_local_dir": res.checkpoint_dir,
        "trainer.save_freq": s.checkpoints.save_every or -1,
        "trainer.max_actor_ckpt_to_keep": keep,
        "trainer.resume_mode": {"auto": "auto", "never": "disable"}.get(resume, "resume_path"),
        "trainer.project_name": spec.logger.project or "grpo-deploy",
        "trainer.experiment_name": spec.run.name,
        "trainer.logger": ["console"] + ([_VERL_LOGGERS[spec.logger.kind]] if spec.logger.kind in _VERL_LOGGERS
                                         else []),
    }
    if resume not in ("auto", "never"):
        out["trainer.resume_from_path"] = resume
    out.update(s.verl.overrides(res.origins["verl"]))
    return [f"{k}={hydra_value(v)}" for k, v in out.items()]


_VERL_LOGGERS = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow", "jsonl": "file"}
# Hydra's unquoted values: identifiers, numbers, paths, hub ids (no whitespace, quotes, brackets, commas, '$' ...).
_HYDRA_PLAIN = re.compile(r"^[A-Za-z0-9_./@+-]+$")
# Unquoted text Hydra reads as a number, a boolean or null rather than as a string.
_HYDRA_TYPED = re.compile(r"[+-]?(\d[\d_]*\.?[\d_]*([eE][+-]?\d[\d_]*)?|\.\d[\d_]*([eE][+-]?\d[\d_]*)?|inf|nan)"
                          r"|true|false|null", re.IGNORECASE)


def hydra_value(value: Any, nested: bool = False) -> str:
    """A value as Hydra's override grammar (and OmegaConf after it) reads it back: booleans True/False, None null,
    lists ["a","b"] (items double-quoted), strings plain when they hold only safe characters and would not read as a
    number, boolean or null, else single-quoted (see _hydra_quoted)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(x, nested=True) for x in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _CONTROL.search(text):
        raise RenderError(f"refusing to render {text!r} into a Hydra override: it holds a control character")
    if not nested and _HYDRA_PLAIN.fullmatch(text) and not _HYDRA_TYPED.fullmatch(text):
        return text
    return _hydra_quoted(text, '"' if nested else "'")


def _hydra_quoted(text: str, quote: str) -> str:
    """*text* quoted for Hydra: a quote inside is escaped as \\' and only backslashes that precede a quote (or the
    closing one) are doubled, the rest Hydra keeps as they are; '${' is escaped for OmegaConf (a literal, never an
    interpolation such as ${oc.env:WANDB_API_KEY}), with the backslashes before it doubled."""
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    text = re.sub(rf"(\\*)({quote}|$)", lambda m: m.group(1) * 2 + ("\\" + quote if m.group(2) else ""), text)
    return quote + text + quote


def _dump_yaml(header: str, data: dict[str, Any]) -> str:
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120)


def _verl_host_env(res: Resolved, host, config_dir: str, files: dict[str, str], publish_ips=None) -> None:
    spec = res.spec
    files[f"hosts/{host.name}.env"] = _template(
        "verl.env.j2", host=host, run_name=spec.run.name, project=project_name(spec.run.name),
        profile=res.profiles[host.name].name, images=res.images,
        identities=res.identities, mount=spec.storage.mount, volume=spec.storage.volume,
        config_dir=config_dir, ray_role="head" if "head" in host.roles else "worker",
    )


def publish_address(res: Resolved, server_host, resolved: dict[str, str] | None = None) -> str:
    """Where the server's port is published: loopback when the trainer shares its host; else the spec's
    hosts[].publish, the IP the trainer reaches the host by (an IP address, or a name the deployer resolved),
    and loopback while nothing says (vLLM's LoRA and dev endpoints have no authentication: never all interfaces
    unless the spec asks)."""
    if server_host is None or len(server_host.roles) == len(res.engine_info.roles):
        return "127.0.0.1"
    if server_host.publish:
        return server_host.publish
    if resolved and server_host.name in resolved:
        return resolved[server_host.name]
    literal = ip_literal(parse_address(server_host.address).host) if server_host.address != "local" else None
    return literal or "127.0.0.1"


def _trl_host_env(res: Resolved, host, config_dir: str, files: dict[str, str], publish_ips=None) -> None:
    spec = res.spec
    profile = res.profiles[host.name]
    compose_files = [COMPOSE_BASE]
    if spec.storage.nfs is not None:
        compose_files.append(COMPOSE_NFS)
    elif host.shared_dir:
        compose_files.append(COMPOSE_BIND)
    gpu = profile.accelerator == "cuda"
    if gpu:
        compose_files.append(f"{config_dir.rsplit('/config', 1)[0]}/hosts/{host.name}.gpu.yaml")
        files[f"hosts/{host.name}.gpu.yaml"] = _gpu_override(res, host)
    services = [r for r in ("server", "trainer") if r in host.roles]
    server_host = res.host_for("server")
    files[f"hosts/{host.name}.env"] = _template(
        "host.env.j2", host=host, run_name=spec.run.name, project=project_name(spec.run.name), profile=profile.name,
        compose_files=compose_files,
        services=services, images=res.images, identities=res.identities, mount=spec.storage.mount,
        volume=spec.storage.volume, config_dir=config_dir, port=res.settings.vllm.port,
        publish=publish_address(res, server_host, publish_ips),
        shm_size="16g" if gpu else "1g", nfs=spec.storage.nfs, shared_dir=host.shared_dir,
    )


def host_files(res: Resolved, config_dir: str, publish_ips: dict[str, str] | None = None) -> dict[str, str]:
    """Per-host compose environment (and GPU reservation override) for every host of the spec."""
    files: dict[str, str] = {}
    for host in res.spec.hosts:
        HOST_FILES[res.engine](res, host, config_dir, files, publish_ips)
    return files


def _gpu_override(res: Resolved, host) -> str:
    profile = res.profiles[host.name]
    services: dict[str, Any] = {}
    for role in ("server", "trainer"):
        if role not in host.roles:
            continue
        ids = gpu_split(res, host)[role]
        services[role] = {
            "deploy": {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "device_ids": [str(i) for i in ids], "capabilities": ["gpu"]}
            ]}}},
            "ipc": "host",
        }
    header = f"# GPU reservations for host {host.name} (profile {profile.name}), rendered by grpo-deploy.\n"
    return _dump_yaml(header, {"services": services})


def _trl_config_files(res: Resolved, publish_ips: dict[str, str] | None = None) -> dict[str, str]:
    spec, s = res.spec, res.settings
    common = dict(run_name=spec.run.name, model_path=s.model.path, served_name=s.model.served_name,
                  vllm=_vllm_context(res), device=s.runtime.device)
    return {
        "config/server.args": _template("server.args.j2", args=server_arg_lines(res), **common),
        "config/server.env": _template("server.env.j2", umask=res.identities["server"].umask, **common),
        "config/trainer.env": _template(
            "trainer.env.j2", umask=res.identities["trainer"].umask, logger=spec.logger.kind,
            logger_project=spec.logger.project or "grpo-deploy", logger_entity=spec.logger.entity, **common),
        "config/trainer.yaml": config_text(
            trainer_config(res, publish_ips),
            f"# Trainer config for run {spec.run.name}, rendered by grpo-deploy; read by grpo_deploy.runtime.train.\n"),
    }


def _verl_config_files(res: Resolved, publish_ips: dict[str, str] | None = None) -> dict[str, str]:
    return {"config/verl-overrides.txt": (
        f"# Hydra overrides for verl 0.9.1 (python -m verl.trainer.main_ppo), run {res.spec.run.name}.\n"
        + "\n".join(verl_overrides(res)) + "\n")}


CONFIG_FILES = {"trl-async": _trl_config_files, "verl": _verl_config_files}
HOST_FILES = {"trl-async": _trl_host_env, "verl": _verl_host_env}


def render_files(res: Resolved, config_dir: str = "/etc/grpo-deploy-render/config",
                 publish_ips: dict[str, str] | None = None) -> dict[str, str]:
    """Every artifact of the run. *config_dir* is where the config/ folder will be on each host (for compose);
    *publish_ips* the server host's IP as the deployer resolved it (`up`)."""
    files = CONFIG_FILES[res.engine](res, publish_ips)
    files.update(host_files(res, config_dir, publish_ips))
    k8s = render_k8s.k8s_files(res)
    check_env_file(k8s["k8s/params.env"], "k8s/params.env")
    files.update(k8s)
    files["resolved.json"] = json.dumps(as_dict(res), indent=2, sort_keys=True, default=str) + "\n"
    return files
