"""Pure builders: a resolved spec -> every artifact of the run, as {relative path: text}. No I/O but package data
(writing a render to a folder, comparing one, reading its env files back: grpo_deploy.rendered).

Layout of a render:
  config/            mounted read-only at /etc/grpo-deploy in every container of the run
    server.args      vLLM server arguments, one per line          (trl-async)
    server.env       server role environment (no secrets)          (trl-async)
    trainer.yaml     the trainer entrypoint's config                (trl-async)
    trainer.env      trainer role environment (no secrets)         (trl-async)
    verl-overrides.txt  Hydra overrides for verl.trainer.main_ppo   (verl)
  hosts/<host>.env   docker compose environment for that host (services to start, images, users, volume)
  hosts/<host>.gpu.yaml  compose override reserving that host's GPUs (GPU profiles only)
  k8s/params.env     values the kustomize overlays consume (images, UID/GID, mount)
  resolved.json      every effective setting with its source and reason
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from typing import Any

import jinja2
import yaml

from .resolve import Resolved, as_dict, gpu_split

COMPOSE_BASE = "compose.yaml"
COMPOSE_NFS = "compose.nfs.yaml"
COMPOSE_BIND = "compose.bind.yaml"


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("grpo_deploy", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _template(name: str, **context: Any) -> str:
    return _env().get_template(name).render(**context)


def _vllm_context(res: Resolved) -> dict[str, Any]:
    keys = ("port", "dtype", "max_lora_rank", "max_loras", "max_cpu_loras", "max_model_len", "gpu_memory_utilization",
            "max_num_seqs", "enforce_eager", "enable_prefix_caching", "max_num_batched_tokens", "load_format")
    ctx = {k: res.v("vllm", k) for k in keys}
    ctx["extra_args"] = list(res.v("vllm", "extra_args") or [])
    ctx["env"] = {name: _env_value(value) for name, value in sorted((res.v("vllm", "env") or {}).items())}
    return ctx


def _env_value(value: Any) -> str:
    if isinstance(value, bool):  # YAML's true/false: the env convention is 1/0
        return "1" if value else "0"
    return str(value)


def server_args(res: Resolved) -> list[str]:
    """The vLLM argument list (comments and blank lines dropped), e.g. for tests and Kubernetes."""
    text = render_files(res)["config/server.args"]
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def trainer_config(res: Resolved) -> dict[str, Any]:
    """The trainer entrypoint's config (grpo_deploy.runtime.train); async_grpo goes verbatim to AsyncGRPOConfig."""
    run_dir = res.run_dir
    device = res.v("runtime", "device")
    trl = {k: v.value for k, v in sorted(res.sections["trl"].items())}
    trl.update(
        output_dir=res.checkpoint_dir,
        vllm_server_base_url=res.server_url,
        seed=res.spec.run.seed,
        report_to=_report_to(res.spec.logger.kind),
        vllm_server_timeout=float(trl.get("vllm_server_timeout", 900.0)),
    )
    if res.spec.logger.kind != "none":
        trl.setdefault("run_name", res.spec.run.name)
    if device == "cpu":
        trl.update(use_cpu=True, bf16=False)
    else:
        trl.setdefault("bf16", True)
    lora = res.sections["lora"]
    return {
        "run_name": res.spec.run.name,
        "seed": res.spec.run.seed,
        "model": res.v("model", "path"),
        "dataset": {
            "name": res.v("data", "dataset"),
            "path": res.v("data", "path"),
            "num_prompts": res.v("data", "num_prompts", 0),
        },
        "rewards": list(res.v("data", "rewards") or []),
        "lora": {k: lora[k].value for k in ("r", "alpha", "dropout", "target_modules") if k in lora},
        "attention_shim": res.v("runtime", "attention_shim", "auto"),
        "response_template": res.v("runtime", "response_template"),
        "device": device,
        "metrics_path": f"{run_dir}/metrics.jsonl",
        "adapters": {"dir": res.checkpoint_dir, "keep": res.adapter_slots},
        "resume": res.v("checkpoints", "resume", "auto"),
        "unload_stale_adapters": True,
        "async_grpo": trl,
    }


def _report_to(kind: str) -> str:
    return {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow"}.get(kind, "none")


def verl_overrides(res: Resolved) -> list[str]:
    """Hydra overrides for `python -m verl.trainer.main_ppo` (verl 0.9.1 key names)."""
    spec = res.spec
    lora = res.sections["lora"]
    keep = res.keep
    out: dict[str, Any] = {
        "actor_rollout_ref.model.path": res.v("model", "path"),
        "actor_rollout_ref.model.lora_rank": lora["r"].value,
        "actor_rollout_ref.model.lora_alpha": lora["alpha"].value,
        "actor_rollout_ref.model.target_modules": lora["target_modules"].value,
        "data.max_prompt_length": res.v("model", "max_prompt_length", 512),
        "data.train_files": f"{spec.storage.mount}/data/{res.v('data', 'dataset')}/train.parquet",
        "data.val_files": f"{spec.storage.mount}/data/{res.v('data', 'dataset')}/test.parquet",
        "trainer.default_local_dir": res.checkpoint_dir,
        "trainer.save_freq": res.v("checkpoints", "save_every", -1),
        "trainer.max_actor_ckpt_to_keep": keep if keep is not None else "null",
        "trainer.resume_mode": _verl_resume(res.v("checkpoints", "resume", "auto")),
        "trainer.project_name": spec.logger.project or "grpo-deploy",
        "trainer.experiment_name": spec.run.name,
        "trainer.logger": _verl_logger(spec.logger.kind),
    }
    if res.v("data", "path"):
        out["data.train_files"] = res.v("data", "path")
    resume = res.v("checkpoints", "resume", "auto")
    if resume not in ("auto", "never"):
        out["trainer.resume_from_path"] = resume
    for key, value in res.sections["verl"].items():
        out[key] = value.value
    return [f"{k}={_hydra_value(v)}" for k, v in out.items()]


def _verl_resume(resume: str) -> str:
    return {"auto": "auto", "never": "disable"}.get(resume, "resume_path")


def _verl_logger(kind: str) -> str:
    extra = {"wandb": ',"wandb"', "tensorboard": ',"tensorboard"', "mlflow": ',"mlflow"', "jsonl": ',"file"'}
    return f'["console"{extra.get(kind, "")}]'


def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(str(x) for x in value) + "]"
    return str(value)


def _dump_yaml(header: str, data: dict[str, Any]) -> str:
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120)


def host_files(res: Resolved, config_dir: str) -> dict[str, str]:
    """Per-host compose environment (and GPU reservation override) for every host of the spec."""
    spec = res.spec
    files: dict[str, str] = {}
    for host in spec.hosts:
        profile = res.profiles[host.name]
        if res.engine == "verl":
            files[f"hosts/{host.name}.env"] = _template(
                "verl.env.j2", host=host, run_name=spec.run.name, profile=profile.name, images=res.images,
                identities=res.identities, mount=spec.storage.mount, volume=spec.storage.volume,
                config_dir=config_dir, ray_role="head" if "head" in host.roles else "worker",
            )
            continue
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
            "host.env.j2", host=host, run_name=spec.run.name, profile=profile.name, compose_files=compose_files,
            services=services, images=res.images, identities=res.identities, mount=spec.storage.mount,
            volume=spec.storage.volume, config_dir=config_dir, port=res.v("vllm", "port"),
            # The server port is published on loopback when both roles share the host, on all interfaces otherwise.
            publish="127.0.0.1" if server_host and len(server_host.roles) == 2 else "0.0.0.0",
            shm_size="16g" if gpu else "1g", nfs=spec.storage.nfs, shared_dir=host.shared_dir,
        )
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


def render_files(res: Resolved, config_dir: str = "/etc/grpo-deploy-render/config") -> dict[str, str]:
    """Every artifact of the run. *config_dir* is where the config/ folder will be on each host (for compose)."""
    spec = res.spec
    files: dict[str, str] = {}
    if res.engine == "trl-async":
        server_ident, trainer_ident = res.identities["server"], res.identities["trainer"]
        common = dict(run_name=spec.run.name, model_path=res.v("model", "path"),
                      served_name=res.v("model", "served_name"), vllm=_vllm_context(res), seed=spec.run.seed,
                      device=res.v("runtime", "device"))
        files["config/server.args"] = _template("server.args.j2", **common)
        files["config/server.env"] = _template("server.env.j2", umask=server_ident.umask, **common)
        files["config/trainer.env"] = _template(
            "trainer.env.j2", umask=trainer_ident.umask, logger=spec.logger.kind,
            logger_project=spec.logger.project or "grpo-deploy", logger_entity=spec.logger.entity, **common)
        files["config/trainer.yaml"] = _dump_yaml(
            f"# Trainer config for run {spec.run.name}, rendered by grpo-deploy; read by grpo_deploy.runtime.train.\n",
            trainer_config(res))
    else:
        files["config/verl-overrides.txt"] = (
            f"# Hydra overrides for verl 0.9.1 (python -m verl.trainer.main_ppo), run {spec.run.name}.\n"
            + "\n".join(verl_overrides(res)) + "\n")
    files.update(host_files(res, config_dir))
    files["k8s/params.env"] = _k8s_params(res)
    files["resolved.json"] = json.dumps(as_dict(res), indent=2, sort_keys=True, default=str) + "\n"
    files["MANIFEST"] = "".join(
        f"{hashlib.sha256(text.encode()).hexdigest()[:16]}  {path}\n" for path, text in sorted(files.items()))
    return files


def _k8s_params(res: Resolved) -> str:
    ident = res.identities["trainer" if res.engine == "trl-async" else "head"]
    lines = [
        f"# Values the kustomize overlays consume for run {res.spec.run.name} (rendered by grpo-deploy).",
        f"run={res.spec.run.name}",
        f"uid={ident.uid}",
        f"gid={ident.gid}",
        f"mount={res.spec.storage.mount}",
    ]
    for role, image in sorted(res.images.items()):
        lines.append(f"image_{role}={image}")
    nfs = res.spec.storage.nfs
    if nfs is not None:
        lines += [f"nfs_server={nfs.server}", f"nfs_export={nfs.export}", f"nfs_options={nfs.options}"]
    if res.engine == "trl-async":
        lines.append(f"served_model={res.v('model', 'served_name')}")
        lines.append(f"server_port={res.v('vllm', 'port')}")
    return "\n".join(lines) + "\n"
