"""The trl-async engine: TRL's async GRPO trainer and one or more vLLM servers (replicas behind the kit's replica
proxy), adapters handed over through the shared volume. It owns the rules that tie them (adapter slots, LoRA rank
slots, context length, the GPU split of a shared host, GPUs and ports per replica, the in-flight cap scaled with the
replicas), the servers' arguments, the proxy's and the trainer's config, each host's compose environment, replica
services and GPU reservation, the server's values for Kubernetes, the memory of both roles (a GPU both share: vLLM's
fraction, the trainer the rest; grpo_deploy.engines.trl_memory), TRL's checkpoint size
(grpo_deploy.engines.trl_sizes) and its knobs (grpo_deploy.engines.trl_knobs)."""

from __future__ import annotations

import posixpath
from typing import Any

from grpo_deploy.architecture import Architecture
from grpo_deploy.common.values import MAX_PORT
from grpo_deploy.diagnose import trl_async as diagnose
from grpo_deploy.engines import trl_files, trl_knobs, trl_memory, trl_replicas, trl_sizes
from grpo_deploy.engines.base import COMMON_SECTIONS, ClusterPorts, Engine, Resolved, RestartWords, human
from grpo_deploy.engines.trl_replicas import (
    any_front,
    check_replicas,
    front_args,
    fronted,
    host_services,
    k8s_front_args,
    pod_vllm_port,
    proxy_args,
    publish_address,
    replica_count,
    replicas_override,
    server_replicas,
)
from grpo_deploy.engines.trl_trainers import (
    check_trainer_processes,
    check_trainer_switches,
    machine_of,
    machine_rank,
    override_key,
    trainer_hosts,
    trainer_machines,
    trainer_processes,
    trainer_ranks,
)
from grpo_deploy.names import (
    COMPOSE_BASE,
    COMPOSE_FRONT,
    COMPOSE_TRAINER_HOSTS,
    COMPOSE_TRAINER_INFINIBAND,
    FRONT_ARGS,
    K8S_RUN_TOKEN_KEY,
    K8S_RUN_TOKEN_SECRET,
    PROXY_SERVICE,
    RUN_TOKEN_FILE,
    project_name,
)
from grpo_deploy.runtime.storage.adapters import POLICY_PREFIX
from grpo_deploy.runtime.trainer.config import config_text
from grpo_deploy.runtime.trainer.processes import MAIN_PORT, MAX_MACHINES
from grpo_deploy.settings import SERVER_PORT, VLLM_LORA_RANKS
from grpo_deploy.templating import dump_yaml, template


class TrlAsync(Engine):
    def gpu_split(self, res: Resolved, host) -> dict[str, list[int]]:
        """grpo_deploy.engines.trl_replicas.gpu_split: server and trainer apart unless they share a host's only GPU."""
        return trl_replicas.gpu_split(res, host)

    def shared_gpus(self, res: Resolved, host) -> list[int]:
        """The GPUs of *host* that its server and trainer both use (on unified memory too): there the server starts
        first and the trainer has what vLLM leaves."""
        split = self.gpu_split(res, host)
        return sorted(set(split.get("server", ())) & set(split.get("trainer", ())))

    def _split_gpus(self, res: Resolved, host) -> list[int]:
        """The shared GPUs whose memory is split (discrete: on unified memory the roles share the host's anyway)."""
        return [] if res.profiles[host.name].hardware.get("unified_memory", False) else self.shared_gpus(res, host)

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
            problem(override_key("vllm", "max_loras"),
                    f"vllm max_loras={max_loras} is too small for trl max_staleness={staleness}: TRL keeps up to "
                    f"max_staleness + 2 = {slots} adapter versions loaded, and a load beyond the slots evicts one "
                    f"still in use. Set it to >= {slots} or lower trl.max_staleness")
        if rank is None or rank < r:
            problem(override_key("vllm", "max_lora_rank"),
                    f"max_lora_rank={rank} is below the adapter's rank lora.r={r}: the server would refuse the "
                    "adapter" if rank else
                    f"lora.r={r} is above vLLM's largest LoRA rank slot ({VLLM_LORA_RANKS[-1]})")
        if vllm.max_model_len is not None and vllm.max_model_len < need_len:
            problem(override_key("vllm", "max_model_len"),
                    f"max_model_len={vllm.max_model_len} < max_prompt_length + max_completion_length = {need_len}")
        n = replica_count(res)
        inflight = s.trl.max_inflight_tasks
        if n > 1 and trainer_machines(res) > 1:
            i, host = next((i, h) for i, h in enumerate(res.spec.hosts) if "server" in h.roles)
            problem(("hosts", i, "replicas") if (host.replicas or 1) > 1 else ("hosts", i, "roles"),
                    f"{n} vLLM servers with {trainer_machines(res)} trainer hosts: the replica proxy beside a trainer "
                    "on its host's network is not built yet; use one server (one host with role server, replicas 1) "
                    "with several trainer hosts, or one trainer host with several servers")
        if n > 1:
            check_replicas(self, res, problem)
            inflight = _scale_with_replicas(res, n, derived)
        if inflight > vllm.max_num_seqs * 4 * n:
            problem(override_key("trl", "max_inflight_tasks"),
                    f"max_inflight_tasks is more than 4x the server's max_num_seqs{f' x {n} replicas' if n > 1 else ''}"
                    ": requests would only queue")
        if s.runtime.device == "cpu" and (s.trl.bf16 or s.trl.fp16):
            problem(override_key("trl", "bf16" if s.trl.bf16 else "fp16"),
                    "mixed precision cannot be used with runtime.device cpu: remove it, or run on cuda")
        elif s.trl.bf16 and s.trl.fp16:
            problem(override_key("trl", "fp16"), "trl.bf16 is true as well: TRL takes at most one of fp16 and bf16 "
                    "(it would refuse to start); remove one")
        check_trainer_switches(res, problem)
        check_trainer_processes(self, res, problem)
        _check_names_and_ports(res, problem)
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
        spec = res.spec
        common = _template_context(res)
        proxy = {"config/proxy.args": template("proxy.args.j2", args=proxy_args(res, publish_ips), **common)} \
            if replica_count(res) > 1 else {}
        if any_front(res):
            proxy[f"config/{FRONT_ARGS}"] = template("front.args.j2", args=front_args(res), **common)
        return {
            **proxy,
            "config/server.args": template("server.args.j2", args=trl_files.server_arg_lines(res), **common),
            "config/server.env": template("server.env.j2", umask=res.identities["server"].umask, **common),
            "config/trainer.env": template(
                "trainer.env.j2", umask=res.identities["trainer"].umask, logger=spec.logger.kind,
                logger_project=spec.logger.project or "grpo-deploy", logger_entity=spec.logger.entity, **common),
            "config/trainer.yaml": config_text(
                trl_files.trainer_config(self, res, publish_ips),
                f"# Trainer config for run {spec.run.name}, rendered by grpo-deploy; read by "
                "grpo_deploy.runtime.trainer.train.\n"),
        }

    def host_files(self, res: Resolved, host, config_dir: str,
                   publish_ips: dict[str, str] | None = None) -> dict[str, str]:
        spec, files = res.spec, {}
        profile = res.profiles[host.name]
        compose_files = self.compose_files(res, host, COMPOSE_BASE)
        gpu = profile.accelerator == "cuda"
        if gpu:
            compose_files.append(f"{config_dir.rsplit('/config', 1)[0]}/hosts/{host.name}.gpu.yaml")
            files[f"hosts/{host.name}.gpu.yaml"] = self._gpuoverride_key(res, host)
        if fronted(res, host):
            compose_files.append(COMPOSE_FRONT)
        if (host.replicas or 1) > 1:
            compose_files.append(f"{config_dir.rsplit('/config', 1)[0]}/hosts/{host.name}.replicas.yaml")
            files[f"hosts/{host.name}.replicas.yaml"] = replicas_override(res, host)
        machine = machine_of(res, host, publish_ips)
        if machine:
            compose_files += [COMPOSE_TRAINER_HOSTS] + ([COMPOSE_TRAINER_INFINIBAND] if host.infiniband else [])
        services = host_services(res, host)
        files[f"hosts/{host.name}.env"] = template(
            "host.env.j2", host=host, run_name=spec.run.name, project=project_name(spec.run.name),
            profile=profile.name, compose_files=compose_files,
            services=services, images=res.images, identities=res.identities, mount=spec.storage.mount,
            volume=spec.storage.volume, config_dir=config_dir, port=res.settings.vllm.port,
            publish=publish_address(res, host if "server" in host.roles else res.host_for("server"), publish_ips),
            shm_size="16g" if gpu else "1g", nfs=spec.storage.nfs, shared_dir=host.shared_dir,
            proxy=PROXY_SERVICE in services, machine=machine,
            token_file=posixpath.join(posixpath.dirname(config_dir.rsplit("/config", 1)[0]), RUN_TOKEN_FILE),
        )
        return files

    def published_ports(self, res: Resolved, host) -> list[int]:
        """The ports *host*'s vLLM replicas publish: vllm.port, then one more for each further replica."""
        return [res.settings.vllm.port + k for k in range(host.replicas or 1)] if "server" in host.roles else []

    def trainer_processes(self, res: Resolved) -> int:
        """Every rank of the trainer's group: its processes on each trainer host."""
        return trainer_ranks(res)

    def spans_hosts(self, spec) -> bool:
        return sum(1 for h in spec.hosts if "trainer" in h.roles) > 1

    def cluster_nodes(self, res: Resolved) -> list:
        """The trainer hosts when there are several, machine 0 first."""
        return trainer_hosts(res) if trainer_machines(res) > 1 else []

    def cluster_ports(self, res: Resolved) -> ClusterPorts | None:
        """The ranks' rendezvous on machine 0 (Gloo and NCCL then pick ports of their own on every machine)."""
        if trainer_machines(res) < 2:
            return None
        return ClusterPorts("the trainer's rendezvous", first=(MAIN_PORT,), reach_first=(MAIN_PORT,))

    def roles_words(self, res: Resolved, host) -> list[str]:
        """Its roles, the server with its replica count when more than one (`server x2`), and the proxy beside the
        trainer when the run has one."""
        n = host.replicas or 1
        words = [f"server x{n}" if role == "server" and n > 1 else role for role in host.roles]
        return words + ([PROXY_SERVICE] if "trainer" in host.roles and replica_count(res) > 1 else [])

    def gpu_words(self, res: Resolved, host) -> str:
        """Each replica's GPUs by its service (`server 0; server-2 1; trainer 2,3`) when the host has several, and the
        trainer's process count when it has several (`(2 trainer processes, FSDP2)`)."""
        ranks, machines = trainer_processes(res) if "trainer" in host.roles else 1, trainer_machines(res)
        more = f" ({ranks} trainer processes, FSDP2)" if ranks > 1 and machines == 1 else ""
        if "trainer" in host.roles and machines > 1:
            more = f" (trainer machine {machine_rank(res, host)} of {machines}: {ranks} process" \
                   f"{'es' if ranks > 1 else ''} here, FSDP2 over {trainer_ranks(res)})"
        profile = res.profiles[host.name]
        shared = self._split_gpus(res, host)
        if shared:
            split, ids = self.gpu_split(res, host), ",".join(map(str, shared))
            cap = profile.hardware.get("memory_gb_per_gpu")
            words = f"vLLM {res.settings.vllm.gpu_memory_utilization:g} of {cap} GB, trainer the rest"
            if split["server"] == split["trainer"] and (host.replicas or 1) == 1:
                return f"server+trainer share GPU {ids} ({words})" + more
            more = f" (GPU {ids} shared: {words})" + more
        if (host.replicas or 1) == 1 or profile.accelerator == "none":
            return super().gpu_words(res, host) + more
        words = [f"{r.service} {','.join(map(str, r.gpus))}" for r in server_replicas(res) if r.host == host.name]
        split = self.gpu_split(res, host)
        return "; ".join(words + ([f"trainer {','.join(map(str, split['trainer']))}"] if "trainer" in split else [])) \
            + more

    def _gpuoverride_key(self, res: Resolved, host) -> str:
        """The compose override reserving each service's GPUs on *host*."""
        profile = res.profiles[host.name]
        services: dict[str, Any] = {}
        split = self.gpu_split(res, host)
        reserved = {r.service: list(r.gpus) for r in server_replicas(res) if r.host == host.name}
        if "trainer" in host.roles:
            reserved["trainer"] = split["trainer"]
        for service, ids in reserved.items():
            services[service] = {
                "deploy": {"resources": {"reservations": {"devices": [
                    {"driver": "nvidia", "device_ids": [str(i) for i in ids], "capabilities": ["gpu"]}
                ]}}},
                "ipc": "host",
            }
        header = f"# GPU reservations for host {host.name} (profile {profile.name}), rendered by grpo-deploy.\n"
        return dump_yaml(header, {"services": services})

    def diagnose(self, events, res: Resolved):
        """Seed 004's rules over TRL's async metrics (grpo_deploy.diagnose.trl_async)."""
        hint = {**diagnose.settings_hint(res, trainer_ranks(res), trainer_machines(res)),
                "replicas": replica_count(res)}
        return diagnose.diagnose(events, hint), diagnose.LABELS

    def k8s_params(self, res: Resolved) -> dict[str, Any]:
        """The served model (the trainer's wait), the front's port (the Service's, the NetworkPolicy's) and vLLM's
        port on the server pod's loopback (its probes)."""
        return {"served_model": res.settings.model.served_name, "server_port": res.settings.vllm.port,
                "vllm_port": pod_vllm_port(res)}

    def k8s_secrets(self, res: Resolved) -> dict[str, str]:
        """The run's token, which the front asks of every request and the trainer sends."""
        return {K8S_RUN_TOKEN_SECRET: K8S_RUN_TOKEN_KEY}

    def k8s_config_files(self, res: Resolved) -> dict[str, str]:
        """The server pod's own arguments: vLLM on loopback (127.0.0.1:pod_vllm_port) and the front before it on
        vllm.port (front.args: the compose fronts' arguments and that one replica), the run's token from the Secret
        K8S_RUN_TOKEN_SECRET in the front's environment, never here."""
        common = _template_context(res)
        loopback = ("127.0.0.1", pod_vllm_port(res))
        return {
            f"k8s/{FRONT_ARGS}": template("front.args.j2", args=k8s_front_args(res), **common),
            "k8s/server.args": template("server.args.j2", args=trl_files.server_arg_lines(res, loopback), **common),
        }

    def memory(self, res: Resolved, arch: Architecture, host, role: str, cap: float) -> dict[str, Any] | None:
        """vLLM's share and the trainer's need against the rest (grpo_deploy.engines.trl_memory); a short side carries
        `short` (which side, need vs available, by how much) and `fix`."""
        profile = res.profiles[host.name]
        shared = self._split_gpus(res, host)
        if role == "server":
            return trl_memory.server(res, arch, cap, bool(shared))
        return trl_memory.trainer(res, arch, profile, cap, "server" in host.roles, shared)

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

    def max_completion_length(self, res: Resolved) -> int | None:
        return res.settings.trl.max_completion_length

    def loss_objective(self, res: Resolved) -> str:
        """TRL 1.16's async loss divides each microbatch's token sum by its own token count (seed 004): with packing a
        microbatch is a row of many answers (close to a per-token average over the step), without it a microbatch is
        per_device_train_batch_size answers (per answer at 1). trl #7206; the fix, PR #7249, is not released."""
        trl = res.settings.trl
        keep = ("; TRL 1.16 has no switch that holds the weighting, no loss_type, PR #7249 open: keep token_budget, "
                "per_device_train_batch_size and gradient_accumulation_steps unchanged across resumes)")
        return self._objective_words(trl)[:-1] + keep

    @staticmethod
    def _objective_words(trl) -> str:
        if trl.token_budget:
            return (f"per token over packed rows (token_budget {trl.token_budget} > 0): each row's token sum / its "
                    "tokens, close to a per-token average over the step (DAPO's weighting); packing off would make it "
                    "per answer (seed 004, trl #7206)")
        if trl.per_device_train_batch_size == 1:
            return ("per answer (token_budget 0, one answer per microbatch): every answer weighs the same however "
                    "long (GRPO's original weighting); packing on would make it per token (seed 004, trl #7206)")
        return (f"per microbatch of {trl.per_device_train_batch_size} answers (token_budget 0): each microbatch's "
                "token sum / its tokens, between per answer and per token; packing on would make it per token over "
                "packed rows (seed 004, trl #7206)")


def _template_context(res: Resolved) -> dict[str, Any]:
    """What every config template of the engine reads (config/ and the Kubernetes pods' k8s/ files alike)."""
    s = res.settings
    return dict(run_name=res.spec.run.name, model_path=s.model.path, served_name=s.model.served_name,
                vllm=trl_files.vllm_context(res), device=s.runtime.device)


def _scale_with_replicas(res: Resolved, n: int, derived: list) -> int:
    """TRL's in-flight cap and queue are one for all replicas together (HF's third replica added nothing at the old
    cap): unless the spec sets them, the profile's (or TRL's automatic) value is taken per replica and multiplied by
    *n*. The in-flight cap the run gets."""
    trl, inflight = res.settings.trl, res.settings.trl.max_inflight_tasks
    for key in ("max_inflight_tasks", "queue_maxsize"):
        origin = res.origins["trl"].get(key)
        if origin is not None and origin.source in ("spec", "override"):
            continue
        value = getattr(trl, key)
        if value == -1:
            value = diagnose.trl_auto_inflight(trl, trainer_ranks(res))
            source = f"TRL's automatic {value} (max_staleness x samples per step)"
        else:
            source = f"{value} ({origin.source if origin else 'default'})"
        derived.append(("trl", key, value * n, f"{source} per replica x {n} replicas: TRL's cap is one for all "
                        "replicas together (HF's third replica added nothing at the old cap)"))
        if key == "max_inflight_tasks":
            inflight = value * n
    return inflight


def _check_names_and_ports(res: Resolved, problem) -> None:
    """The served model's name is not one of the trainer's adapter names; every replica's published port exists."""
    served = res.settings.model.served_name
    if served and served.startswith(POLICY_PREFIX):
        origin = res.origins["model"].get("served_name")
        path = origin.path if origin is not None and origin.path else ("model", "served_name")
        problem(path, f"{served!r} starts with {POLICY_PREFIX!r}, the prefix of the trainer's adapter names: the "
                "stale-adapter sweep would take the base model for an adapter to unload; set model.served_name to "
                "another name")
    port = res.settings.vllm.port
    for i, host in enumerate(res.spec.hosts):
        last = port + (host.replicas or 1) - 1
        if "server" in host.roles and last > MAX_PORT:
            problem(("hosts", i, "replicas"),
                    f"{host.replicas} replicas on host {host.name} publish ports {port}-{last} (vllm.port, then one "
                    f"more each) and the last port is {MAX_PORT}: lower overrides.vllm.port to "
                    f"{MAX_PORT - (host.replicas or 1) + 1} or below, or the replicas")


def _check_gpus(engine: Engine, res: Resolved, problem) -> None:
    """Every role of a GPU host gets at least one GPU. Server and trainer may share one: whether they fit is a matter
    of memory (plan's split, preflight's memory check), not of the door."""
    for i, host in enumerate(res.spec.hosts):
        profile = res.profiles[host.name]
        for role, ids in engine.gpu_split(res, host).items():
            if not ids:
                problem(("hosts", i, "gpus"), f"host {host.name} gives the {role} no GPU (its profile {profile.name} "
                        f"has {profile.hardware.get('gpus_per_host')}): list at least one in hosts[{i}].gpus.{role}, "
                        "e.g. gpus: {server: [0], trainer: [0]} to share GPU 0")
                break


TRL_ASYNC = TrlAsync(
    name="trl-async",
    description="TRL async GRPO trainer + a vLLM server, adapters handed over through the shared volume",
    roles=("server", "trainer"),
    main_role="trainer",
    progress=(("staleness", "sample/staleness_mean", ".2f"), ("ratio", "ratio", ".4f"),
              ("queue", "sample/rollout_queue_size", ".0f")),
    role_images={"server": "server", "trainer": "trainer"},
    role_counts={"trainer": (1, MAX_MACHINES), "server": (1, 16)},
    replica_role="server",
    published_role="server",
    unread_keys={"dataset.size": "its steps are overrides.trl.max_steps, not a count of prompts"},
    # what TRL 1.16's async trainer logs (tests/unit/metrics/cpu_rehearsal.jsonl); it does not validate
    watch_keys={"reward": "reward", "length": "completions/mean_length", "capped": "completions/clipped_ratio",
                "kl": "kl", "ratio": "ratio", "staleness": "sample/dropped_stale_total",
                "samples": "batch/samples_per_step", "validation": None},
    steps_setting="overrides.trl.max_steps",
    tune_figures={"answer_tok_s": "rollout/generated_tok_s", "fwd_bwd_tok_s": "perf/forwarded_tok_s_fwd_bwd"},
    logger_keys={"project": ("wandb",), "entity": ("wandb",)},  # WANDB_PROJECT/ENTITY: TRL's other loggers read none
    sections=COMMON_SECTIONS + ("trl", "vllm", "runtime"),
    checkpoint_layout="trl",
    reader_role="server",
    unreadable_share="vLLM would answer 404 and TRL would misreport it as 'does not expose /v1/load_lora_adapter'",
    single_host_roles=("server", "trainer"),
    multi_host_roles=(("trainer",), ("server",)),
    settings_roles={"vllm": "server"},
    tune_knobs=trl_knobs.TUNE_KNOBS,
    tune_sides=trl_knobs.TUNE_SIDES,
    restart_words=RestartWords(
        died={"server": "the vLLM server", "replica": "a vLLM server replica", "proxy": "the replica proxy"},
        again={"server": "the server and the trainer"},
        alone={"replica": " with the other replicas", "proxy": " once it answers"},
        logs_role={"replica": "server"}),
)
