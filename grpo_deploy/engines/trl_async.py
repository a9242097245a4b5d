"""The trl-async engine: TRL's async GRPO trainer and a vLLM server, adapters handed over through the shared volume.
It owns the rules that tie the two (adapter slots, LoRA rank slots, context length, the GPU split of a shared host),
the server's arguments and the trainer's config, each host's compose environment and GPU reservation, the server's
values for Kubernetes, the memory of both roles and TRL's checkpoint size (grpo_deploy.engines.trl_sizes)."""

from __future__ import annotations

from typing import Any

from .. import diagnose
from ..architecture import Architecture
from ..names import COMPOSE_BASE, project_name
from ..render_text import dump_yaml, template
from ..runtime.config import RunConfig, SpeedSwitches, config_text
from ..runtime.values import ip_literal, parse_address
from ..settings import SECTIONS, SERVER_PORT, VLLM_KIT_FLAGS, VLLM_LORA_RANKS, KitFlag, vllm_flags
from . import trl_sizes
from .base import COMMON_SECTIONS, GB, Engine, Resolved, human


def _override(section: str, key: str) -> tuple[Any, ...]:
    """The spec key a user changes to fix a broken rule (an override, whether or not it is written yet)."""
    return ("overrides", section, key)


class TrlAsync(Engine):
    def gpu_split(self, res: Resolved, host) -> dict[str, list[int]]:
        """The spec's hosts[].gpus, else server on GPU 0 and the trainer on the rest when both roles share a host
        (and no unified memory), else every GPU of the profile for the one role."""
        profile = res.profiles[host.name]
        if profile.accelerator != "cuda":
            return {}
        n = int(profile.hardware.get("gpus_per_host", 1))
        given = dict(host.gpus or {})
        if len(host.roles) == 2 and not profile.hardware.get("unified_memory", False):
            given.setdefault("server", [0])
            given.setdefault("trainer", list(range(1, n)))
        for role in host.roles:
            given.setdefault(role, list(range(n)))
        return given

    def derive(self, res: Resolved, problem, derived: list) -> None:
        _check_gpus(self, res, problem)
        s = res.settings
        slots, staleness, r = res.adapter_slots, s.trl.max_staleness, s.lora.r
        vllm = s.vllm
        max_loras = vllm.max_loras if vllm.max_loras is not None else slots
        if vllm.max_loras is None:
            derived.append(("vllm", "max_loras", slots,
                            f"max_staleness ({staleness}) + 2: TRL keeps that many adapter versions loaded"))
        if vllm.max_cpu_loras is None:
            derived.append(("vllm", "max_cpu_loras", max_loras, "same as max_loras"))
        fitting = [x for x in VLLM_LORA_RANKS if x >= r]
        rank = vllm.max_lora_rank
        if rank is None and fitting:
            rank = fitting[0]
            derived.append(("vllm", "max_lora_rank", rank, f"smallest vLLM LoRA rank slot >= lora.r ({r})"))
        need_len = s.model.max_prompt_length + s.trl.max_completion_length
        if vllm.max_model_len is None:
            derived.append(("vllm", "max_model_len", need_len, "max_prompt_length + max_completion_length"))
        if "port" not in res.origins["vllm"]:
            derived.append(("vllm", "port", SERVER_PORT, "vLLM's default port"))

        if max_loras < slots:
            problem(_override("vllm", "max_loras"),
                    f"vllm max_loras={max_loras} is too small for trl max_staleness={staleness}: TRL keeps up to "
                    f"max_staleness + 2 = {slots} adapter versions loaded, and a load beyond the slots evicts one "
                    f"still in use. Set it to >= {slots} or lower trl.max_staleness")
        if rank is None or rank < r:
            problem(_override("vllm", "max_lora_rank"),
                    f"max_lora_rank={rank} is below the adapter's rank lora.r={r}: the server would refuse the "
                    "adapter" if rank else
                    f"lora.r={r} is above vLLM's largest LoRA rank slot ({VLLM_LORA_RANKS[-1]})")
        if vllm.max_model_len is not None and vllm.max_model_len < need_len:
            problem(_override("vllm", "max_model_len"),
                    f"max_model_len={vllm.max_model_len} < max_prompt_length + max_completion_length = {need_len}")
        if s.trl.max_inflight_tasks > vllm.max_num_seqs * 4:
            problem(_override("trl", "max_inflight_tasks"),
                    "max_inflight_tasks is more than 4x the server's max_num_seqs: requests would only queue")
        if s.runtime.device == "cpu" and (s.trl.bf16 or s.trl.fp16):
            problem(_override("trl", "bf16" if s.trl.bf16 else "fp16"),
                    "mixed precision cannot be used with runtime.device cpu: remove it, or run on cuda")
        if s.data.dataset != "brevity" and s.data.path is None:
            derived.append(("data", "path", f"{res.spec.storage.mount}/data/{s.data.dataset}/train.jsonl",
                            "default: the dataset's JSONL file on the shared volume (set dataset.path to change)"))
        ck = s.checkpoints
        if ck.save_every:
            derived.append(("trl", "save_strategy", "steps", "checkpoints.save_every"))
            derived.append(("trl", "save_steps", ck.save_every, "checkpoints.save_every"))
        if ck.keep is not None:
            derived.append(("trl", "save_total_limit", ck.keep, "checkpoints.keep"))

    def config_files(self, res: Resolved, publish_ips: dict[str, str] | None = None) -> dict[str, str]:
        spec, s = res.spec, res.settings
        common = dict(run_name=spec.run.name, model_path=s.model.path, served_name=s.model.served_name,
                      vllm=_vllm_context(res), device=s.runtime.device)
        return {
            "config/server.args": template("server.args.j2", args=server_arg_lines(res), **common),
            "config/server.env": template("server.env.j2", umask=res.identities["server"].umask, **common),
            "config/trainer.env": template(
                "trainer.env.j2", umask=res.identities["trainer"].umask, logger=spec.logger.kind,
                logger_project=spec.logger.project or "grpo-deploy", logger_entity=spec.logger.entity, **common),
            "config/trainer.yaml": config_text(
                trainer_config(res, publish_ips),
                f"# Trainer config for run {spec.run.name}, rendered by grpo-deploy; read by "
                "grpo_deploy.runtime.train.\n"),
        }

    def host_files(self, res: Resolved, host, config_dir: str,
                   publish_ips: dict[str, str] | None = None) -> dict[str, str]:
        spec, files = res.spec, {}
        profile = res.profiles[host.name]
        compose_files = self.compose_files(res, host, COMPOSE_BASE)
        gpu = profile.accelerator == "cuda"
        if gpu:
            compose_files.append(f"{config_dir.rsplit('/config', 1)[0]}/hosts/{host.name}.gpu.yaml")
            files[f"hosts/{host.name}.gpu.yaml"] = self._gpu_override(res, host)
        services = [r for r in self.roles if r in host.roles]
        files[f"hosts/{host.name}.env"] = template(
            "host.env.j2", host=host, run_name=spec.run.name, project=project_name(spec.run.name),
            profile=profile.name, compose_files=compose_files,
            services=services, images=res.images, identities=res.identities, mount=spec.storage.mount,
            volume=spec.storage.volume, config_dir=config_dir, port=res.settings.vllm.port,
            publish=publish_address(res, res.host_for("server"), publish_ips),
            shm_size="16g" if gpu else "1g", nfs=spec.storage.nfs, shared_dir=host.shared_dir,
        )
        return files

    def _gpu_override(self, res: Resolved, host) -> str:
        """The compose override reserving each service's GPUs on *host*."""
        profile = res.profiles[host.name]
        services: dict[str, Any] = {}
        split = self.gpu_split(res, host)
        for role in (r for r in self.roles if r in host.roles):
            services[role] = {
                "deploy": {"resources": {"reservations": {"devices": [
                    {"driver": "nvidia", "device_ids": [str(i) for i in split[role]], "capabilities": ["gpu"]}
                ]}}},
                "ipc": "host",
            }
        header = f"# GPU reservations for host {host.name} (profile {profile.name}), rendered by grpo-deploy.\n"
        return dump_yaml(header, {"services": services})

    def diagnose(self, events, res: Resolved):
        """Seed 004's rules over TRL's async metrics (grpo_deploy.diagnose)."""
        return diagnose.diagnose(events, diagnose.settings_hint(res)), diagnose.LABELS

    def k8s_params(self, res: Resolved) -> dict[str, Any]:
        return {"served_model": res.settings.model.served_name, "server_port": res.settings.vllm.port}

    def memory(self, res: Resolved, arch: Architecture, host, role: str, cap: float) -> dict[str, Any] | None:
        weights = arch.params() * 2
        if role == "server":
            gmu = res.settings.vllm.gpu_memory_utilization
            pool = gmu * cap
            kv = pool - weights
            per_seq = arch.kv_bytes_per_token() * (res.settings.vllm.max_model_len or 0)
            seqs = int(kv // per_seq) if per_seq and kv > 0 else 0
            return {"role": "server", "budget_gb": round(pool / GB, 1), "weights_gb": round(weights / GB, 2),
                    "kv_cache_gb": round(max(kv, 0) / GB, 1), "full_length_sequences": seqs,
                    "fits": kv > 0 and seqs >= 1, "why": f"gpu_memory_utilization {gmu} x {cap / GB:.0f} GB"}
        profile = res.profiles[host.name]
        trl = res.settings.trl
        tokens = trl.token_budget or (res.settings.model.max_prompt_length + trl.max_completion_length) \
            * trl.per_device_train_batch_size
        ckpt = trl.gradient_checkpointing
        per_tok = arch.num_hidden_layers * arch.hidden_size * (2 if ckpt else 34) + arch.hidden_size * 34
        act = tokens * per_tok + tokens * arch.vocab_size * 6
        lora = arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules) * 16
        need = weights + lora + act
        avail = cap
        if "server" in host.roles and profile.hardware.get("unified_memory", False) or profile.accelerator == "none":
            avail = cap * (1 - res.settings.vllm.gpu_memory_utilization)
        return {"role": "trainer", "estimate_gb": round(need / GB, 1), "available_gb": round(avail / GB, 1),
                "fits": need <= avail,
                "why": f"rough: weights {weights / GB:.1f} GB + LoRA/optimizer + activations for {tokens} "
                       f"tokens per microbatch ({'with' if ckpt else 'without'} gradient checkpointing)"}

    def checkpoint_bytes(self, res: Resolved, arch: Architecture,
                         step: int | None = None) -> tuple[int, int, list[str]]:
        parts = trl_sizes.checkpoint_parts(res, arch, self.total_steps(res) if step is None else step)
        total = sum(parts.values())
        why = ["TRL checkpoint = " + " + ".join(f"{name.replace('_', ' ')} {human(b)}"
                                                for name, b in parts.items()) + f" = {human(total)}"]
        return total, trl_sizes.adapter_dir_bytes(res, arch), why

    def checkpoint_growth(self, res: Resolved) -> tuple[int, int]:
        return trl_sizes.TRAINER_STATE_BYTES_PER_LOG, trl_sizes.log_interval(res, self.total_steps(res))

    def adapters_kept(self, res: Resolved) -> int:
        return res.adapter_slots

    def total_steps(self, res: Resolved) -> int:
        return max(res.settings.trl.max_steps, 0)


def _check_gpus(engine: TrlAsync, res: Resolved, problem) -> None:
    """Both roles on one host need GPUs of their own (unless the memory is unified)."""
    for i, host in enumerate(res.spec.hosts):
        split = engine.gpu_split(res, host)
        profile = res.profiles[host.name]
        if split and any(not ids for ids in split.values()):
            problem(("hosts", i, "gpus"), f"host {host.name} runs both roles but its profile {profile.name} has "
                    f"{profile.hardware.get('gpus_per_host')} GPU: give each role its own GPUs, e.g. "
                    "gpus: {server: [0], trainer: [1]}, or use two hosts")
        elif split and "server" in split and "trainer" in split and set(split["server"]) & set(split["trainer"]) \
                and not profile.hardware.get("unified_memory", False):
            problem(("hosts", i, "gpus"), "server and trainer share a GPU: vLLM reserves gpu_memory_utilization of it "
                    "and the trainer runs out of memory; give them separate GPUs")


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
        "disk_watchdog": TRL_ASYNC.disk_watchdog(res),
        **({"speed": speed} if (speed := _speed(res)) else {}),
        "async_grpo": grpo,
    })


def _speed(res: Resolved) -> dict:
    """The trainer's speed switches the profile turns on (none: today's path, and no `speed` key in trainer.yaml)."""
    default = SpeedSwitches()
    return {name: getattr(res.settings.runtime, name) for name in SpeedSwitches.model_fields
            if getattr(res.settings.runtime, name) != getattr(default, name)}


def _report_to(kind: str) -> str:
    return {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow"}.get(kind, "none")


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


TRL_ASYNC = TrlAsync(
    name="trl-async",
    description="TRL async GRPO trainer + a vLLM server, adapters handed over through the shared volume",
    roles=("server", "trainer"),
    main_role="trainer",
    bringup="grpo_deploy.bringup.trl_async",
    progress=(("staleness", "sample/staleness_mean", ".2f"), ("ratio", "ratio", ".4f"),
              ("queue", "sample/rollout_queue_size", ".0f")),
    role_images={"server": "server", "trainer": "trainer"},
    role_counts={"trainer": (1, 1), "server": (1, 1)},
    sections=COMMON_SECTIONS + ("trl", "vllm", "runtime"),
    checkpoint_layout="trl",
    reader_role="server",
    unreadable_share="vLLM would answer 404 and TRL would misreport it as 'does not expose /v1/load_lora_adapter'",
    single_host_roles=("server", "trainer"),
    multi_host_roles=(("trainer",), ("server",)),
    settings_roles={"vllm": "server"},
    unsupported={
        "several server hosts": "several vLLM server replicas need a proxy that broadcasts adapter loads to every "
                                "replica (TRL takes one base URL); that proxy is not built yet: use one server host",
    },
)
