"""The trl-async engine: TRL's async GRPO trainer and one or more vLLM servers (replicas behind the kit's replica
proxy), adapters handed over through the shared volume. It owns the rules that tie them (adapter slots, LoRA rank
slots, context length, the GPU split of a shared host, GPUs and ports per replica, the in-flight cap scaled with the
replicas), the servers' arguments, the proxy's and the trainer's config, each host's compose environment, replica
services and GPU reservation, the server's values for Kubernetes, the memory of both roles (a GPU both share: vLLM's
fraction, the trainer the rest; grpo_deploy.engines.trl_memory) and TRL's checkpoint size
(grpo_deploy.engines.trl_sizes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_deploy.architecture import Architecture
from grpo_deploy.common.values import MAX_PORT, host_part, ip_literal
from grpo_deploy.diagnose import trl_async as diagnose
from grpo_deploy.engines import trl_memory, trl_sizes
from grpo_deploy.engines.base import COMMON_SECTIONS, ClusterPorts, Engine, Resolved, human
from grpo_deploy.names import (
    COMPOSE_BASE,
    COMPOSE_TRAINER_HOSTS,
    COMPOSE_TRAINER_INFINIBAND,
    PROXY_SERVICE,
    REPLICA_LABEL,
    project_name,
)
from grpo_deploy.runtime.storage.adapters import POLICY_PREFIX
from grpo_deploy.runtime.trainer.config import RunConfig, SpeedSwitches, config_text
from grpo_deploy.runtime.trainer.processes import MAIN_PORT, MAX_MACHINES
from grpo_deploy.settings import SECTIONS, SERVER_PORT, VLLM_KIT_FLAGS, VLLM_LORA_RANKS, KitFlag, vllm_flags
from grpo_deploy.templating import dump_yaml, template


def _override(section: str, key: str) -> tuple[Any, ...]:
    """The spec key a user changes to fix a broken rule (an override, whether or not it is written yet)."""
    return ("overrides", section, key)


class TrlAsync(Engine):
    def gpu_split(self, res: Resolved, host) -> dict[str, list[int]]:
        """The spec's hosts[].gpus, else server on GPU 0 and the trainer on the rest when both roles share a host
        (and no unified memory) — both on GPU 0 when it is the host's only one (vLLM takes gpu_memory_utilization
        of it, the trainer the rest) — else every GPU of the profile for the one role."""
        profile = res.profiles[host.name]
        if profile.accelerator != "cuda":
            return {}
        n = int(profile.hardware.get("gpus_per_host", 1))
        given = dict(host.gpus or {})
        if len(host.roles) == 2 and not profile.hardware.get("unified_memory", False):
            given.setdefault("server", [0])
            given.setdefault("trainer", list(range(1, n)) if n > 1 else [0])
        for role in host.roles:
            given.setdefault(role, list(range(n)))
        return given

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
        n = replica_count(res)
        inflight = s.trl.max_inflight_tasks
        if n > 1 and trainer_machines(res) > 1:
            i, host = next((i, h) for i, h in enumerate(res.spec.hosts) if "server" in h.roles)
            problem(("hosts", i, "replicas") if (host.replicas or 1) > 1 else ("hosts", i, "roles"),
                    f"{n} vLLM servers with {trainer_machines(res)} trainer hosts: the replica proxy beside a trainer "
                    "on its host's network is not built yet; use one server (one host with role server, replicas 1) "
                    "with several trainer hosts, or one trainer host with several servers")
        if n > 1:
            _check_replicas(self, res, problem)
            inflight = _scale_with_replicas(res, n, derived)
        if inflight > vllm.max_num_seqs * 4 * n:
            problem(_override("trl", "max_inflight_tasks"),
                    f"max_inflight_tasks is more than 4x the server's max_num_seqs{f' x {n} replicas' if n > 1 else ''}"
                    ": requests would only queue")
        if s.runtime.device == "cpu" and (s.trl.bf16 or s.trl.fp16):
            problem(_override("trl", "bf16" if s.trl.bf16 else "fp16"),
                    "mixed precision cannot be used with runtime.device cpu: remove it, or run on cuda")
        elif s.trl.bf16 and s.trl.fp16:
            problem(_override("trl", "fp16"), "trl.bf16 is true as well: TRL takes at most one of fp16 and bf16 "
                    "(it would refuse to start); remove one")
        _check_trainer_switches(res, problem)
        _check_trainer_processes(self, res, problem)
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
        spec, s = res.spec, res.settings
        common = dict(run_name=spec.run.name, model_path=s.model.path, served_name=s.model.served_name,
                      vllm=_vllm_context(res), device=s.runtime.device)
        proxy = {"config/proxy.args": template("proxy.args.j2", args=proxy_args(res, publish_ips), **common)} \
            if replica_count(res) > 1 else {}
        return {
            **proxy,
            "config/server.args": template("server.args.j2", args=server_arg_lines(res), **common),
            "config/server.env": template("server.env.j2", umask=res.identities["server"].umask, **common),
            "config/trainer.env": template(
                "trainer.env.j2", umask=res.identities["trainer"].umask, logger=spec.logger.kind,
                logger_project=spec.logger.project or "grpo-deploy", logger_entity=spec.logger.entity, **common),
            "config/trainer.yaml": config_text(
                trainer_config(res, publish_ips),
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
            files[f"hosts/{host.name}.gpu.yaml"] = self._gpu_override(res, host)
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
            more = f" (trainer machine {_machine_rank(res, host)} of {machines}: {ranks} process" \
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

    def _gpu_override(self, res: Resolved, host) -> str:
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
        """Seed 004's rules over TRL's async metrics (grpo_deploy.diagnose)."""
        hint = {**diagnose.settings_hint(res, trainer_ranks(res), trainer_machines(res)),
                "replicas": replica_count(res)}
        return diagnose.diagnose(events, hint), diagnose.LABELS

    def k8s_params(self, res: Resolved) -> dict[str, Any]:
        return {"served_model": res.settings.model.served_name, "server_port": res.settings.vllm.port}

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


@dataclass(frozen=True)
class ServerReplica:
    """One vLLM server of the run: its host, its compose service, its place on that host (its published port is
    vllm.port + place) and its GPUs (none on a CPU host)."""

    host: str
    service: str
    place: int
    gpus: tuple[int, ...] = ()


def replica_service(place: int) -> str:
    """The compose service of a host's replica at *place*: `server` first (one replica: today's service), then
    `server-2`, `server-3`, ..."""
    return "server" if place == 0 else f"server-{place + 1}"


def server_replicas(res: Resolved) -> list[ServerReplica]:
    """Every vLLM server of the run, host by host in spec order; a host's server GPUs shared out evenly."""
    out = []
    for host in res.hosts_with("server"):
        n = host.replicas or 1
        gpus = TRL_ASYNC.gpu_split(res, host).get("server", [])
        share = len(gpus) // n
        out += [ServerReplica(host.name, replica_service(k), k, tuple(gpus[k * share:(k + 1) * share]))
                for k in range(n)]
    return out


def replica_count(res: Resolved) -> int:
    """vLLM servers in the run; more than one puts the replica proxy between them and the trainer."""
    return sum(h.replicas or 1 for h in res.hosts_with("server"))


def server_url(res: Resolved, resolved: dict[str, str] | None = None) -> str:
    """The URL the trainer reaches the vLLM server by: the replica proxy beside it when the run has several, else
    where the proxy would reach the one server (replica_urls)."""
    urls = replica_urls(res, resolved)
    if len(urls) > 1:
        return f"http://{PROXY_SERVICE}:{res.settings.vllm.port}"
    return urls[0] if urls else ""


def host_services(res: Resolved, host) -> list[str]:
    """The compose services *host* runs, in start order: its server replicas, then the replica proxy (beside the
    trainer, when the run has several replicas) and the trainer."""
    out = [r.service for r in server_replicas(res) if r.host == host.name]
    if "trainer" in host.roles:
        out += [PROXY_SERVICE, "trainer"] if replica_count(res) > 1 else ["trainer"]
    return out


def replica_urls(res: Resolved, resolved: dict[str, str] | None = None) -> list[str]:
    """Where the proxy (on the trainer's host) reaches each replica: a replica beside it by its compose service (by
    its published port on loopback when the trainer runs on the host's network: a trainer over several hosts), one
    on another host by that host's address and the replica's published port."""
    trainer, port = res.host_for("trainer"), res.settings.vllm.port
    host_network = trainer_machines(res) > 1
    out = []
    for r in server_replicas(res):
        if trainer is not None and r.host == trainer.name:
            out.append(f"http://127.0.0.1:{port + r.place}" if host_network else f"http://{r.service}:{port}")
        else:
            out.append(f"http://{res.reach(r.host, resolved)}:{port + r.place}")
    return out


def proxy_args(res: Resolved, resolved: dict[str, str] | None = None) -> list[str]:
    """The replica proxy's command line, one argument per line of config/proxy.args (argparse's @file): it
    listens on vLLM's port in its own container, where the trainer's base URL points."""
    return ["--listen", f"0.0.0.0:{res.settings.vllm.port}",
            *(arg for url in replica_urls(res, resolved) for arg in ("--replica", url))]


def replicas_override(res: Resolved, host) -> str:
    """hosts/<host>.replicas.yaml: each replica after the first a service like `server` (compose's extends), with
    its own published port and labels."""
    port, services = res.settings.vllm.port, {}
    for r in (r for r in server_replicas(res) if r.host == host.name and r.place):
        services[r.service] = {
            "extends": {"file": COMPOSE_BASE, "service": "server"},
            "ports": [f"${{GRPO_SERVER_PUBLISH:-127.0.0.1}}:{port + r.place}:{port}"],
            "labels": {REPLICA_LABEL: str(r.place + 1)},
        }
    header = (f"# vLLM server replicas of host {host.name} beyond the first, rendered by grpo-deploy: each like "
              "`server`, on its own published port.\n")
    return dump_yaml(header, {"services": services}).replace("ports:\n", "ports: !override\n")


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


def _fix_at(res: Resolved, *keys: tuple[str, str]) -> tuple[Any, ...]:
    """The spec key to name for a broken pair of settings (section, key): the first the spec overrides, else the
    first."""
    for section, key in keys:
        origin = res.origins[section].get(key)
        if origin is not None and origin.source == "override":
            return _override(section, key)
    return _override(*keys[0])


def _check_trainer_switches(res: Resolved, problem) -> None:
    """The trainer's speed switches against its precision and device (the trainer config's own rules, said at the
    door with the key to change rather than as a traceback at render)."""
    trl, rt = res.settings.trl, res.settings.runtime
    cpu = rt.device == "cpu"
    autocast = not cpu and (trl.bf16 if trl.bf16 is not None else not trl.fp16)  # as trainer_config sets bf16
    if rt.base_dtype != "fp32" and not autocast:
        cause, why = (("runtime", "device"), "runtime.device is cpu") if cpu else \
            (("trl", "fp16"), "trl.fp16 is true") if trl.bf16 is None else (("trl", "bf16"), "trl.bf16 is false")
        problem(_fix_at(res, ("runtime", "base_dtype"), cause),
                f"runtime.base_dtype {rt.base_dtype} needs bf16 autocast and {why}: set overrides.runtime.base_dtype "
                f"to fp32, or {'run on cuda' if cpu else 'train in bf16'}")
    if rt.fused_kernels != "off" and rt.device != "cuda":
        problem(_fix_at(res, ("runtime", "fused_kernels"), ("runtime", "device")),
                f"runtime.fused_kernels {rt.fused_kernels} (Triton kernels) needs runtime.device cuda and it is "
                f"{rt.device}: set overrides.runtime.fused_kernels to off, or run on cuda")
    if rt.lora_elementwise and not rt.compile_layers:
        problem(_fix_at(res, ("runtime", "lora_elementwise"), ("runtime", "compile_layers")),
                "runtime.lora_elementwise needs runtime.compile_layers (eager, its broadcasts would be materialised): "
                "set overrides.runtime.lora_elementwise to false, or compile_layers to true")


def trainer_processes(res: Resolved) -> int:
    """Trainer processes on each trainer host: runtime.trainer_processes, else 1 (a several-GPU trainer is not the
    default until it has run on GPUs here)."""
    return res.settings.runtime.trainer_processes or 1


def trainer_hosts(res: Resolved) -> list:
    """The hosts with role trainer, in spec order: the first is machine 0 (the rendezvous, rank 0, the metrics)."""
    return res.hosts_with("trainer")


def trainer_machines(res: Resolved) -> int:
    return max(len(trainer_hosts(res)), 1)


def trainer_ranks(res: Resolved) -> int:
    """Ranks of the trainer's one process group: its processes on each trainer host."""
    return trainer_processes(res) * trainer_machines(res)


def _machine_rank(res: Resolved, host) -> int:
    return next(k for k, h in enumerate(trainer_hosts(res)) if h.name == host.name)


def main_address(res: Resolved, resolved: dict[str, str] | None = None) -> str:
    """Machine 0's address as the other trainer hosts reach it: as the deployer found it (preflight's cluster check),
    else the host part of its spec address."""
    first = trainer_hosts(res)[0]
    if resolved and first.name in resolved:
        return resolved[first.name]
    return host_part(first.address)


def machine_of(res: Resolved, host, resolved: dict[str, str] | None = None) -> dict[str, Any] | None:
    """A trainer host's place when the trainer spans several (its host env file's GRPO_MACHINE_RANK ...), else None.
    *resolved*: each node's address as the deployer found it ({} for `render`: Gloo then finds the interface)."""
    if "trainer" not in host.roles or trainer_machines(res) < 2:
        return None
    return {"rank": _machine_rank(res, host), "main_address": main_address(res, resolved), "main_port": MAIN_PORT,
            "node_ip": (resolved or {}).get(host.name, ""), "ifname": host.interface or ""}


def _check_trainer_processes(engine: TrlAsync, res: Resolved, problem) -> None:
    """On cuda at most one trainer process per trainer GPU on each trainer host (an FSDP2 rank owns one GPU); on cpu
    any count (gloo)."""
    n = trainer_processes(res)
    for host in trainer_hosts(res) if res.settings.runtime.device == "cuda" else []:
        gpus = engine.gpu_split(res, host).get("trainer")
        if gpus is not None and n > len(gpus):
            problem(_override("runtime", "trainer_processes"),
                    f"runtime.trainer_processes is {n} but the trainer on {host.name} has {len(gpus)} GPU(s) "
                    f"({gpus}): FSDP2 runs one process per GPU; set it to {len(gpus)} or fewer, or give the trainer "
                    f"{n} GPUs (hosts[].gpus.trainer)")
            return


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


def _check_replicas(engine: TrlAsync, res: Resolved, problem) -> None:
    """Several replicas: on a GPU host each replica needs GPUs of its own, as many each."""
    for i, host in enumerate(res.spec.hosts):
        n = host.replicas or 1
        gpus = engine.gpu_split(res, host).get("server")
        if n > 1 and gpus is not None and (len(gpus) < n or len(gpus) % n):
            problem(("hosts", i, "replicas"), f"{n} replicas on host {host.name} need their own GPUs, as many each: "
                    f"its server has {len(gpus)} ({gpus}); set hosts[{i}].gpus.server to {n} GPUs (or a multiple), "
                    f"or replicas to {len(gpus) or 1}")


def _check_gpus(engine: TrlAsync, res: Resolved, problem) -> None:
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
        "disk_watchdog": TRL_ASYNC.disk_watchdog(res),
        "watch": TRL_ASYNC.watch(res),
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


def publish_address(res: Resolved, server_host, resolved: dict[str, str] | None = None) -> str:
    """Where the server's port is published: loopback when the trainer shares its host; else the spec's
    hosts[].publish, the IP the trainer reaches the host by (an IP address, or a name the deployer resolved),
    and loopback while nothing says (vLLM's LoRA and dev endpoints have no authentication: never all interfaces
    unless the spec asks)."""
    trainer = res.host_for("trainer")
    if server_host is None or trainer is not None and server_host.name == trainer.name:
        return "127.0.0.1"
    if server_host.publish:
        return server_host.publish
    if resolved and server_host.name in resolved:
        return resolved[server_host.name]
    literal = ip_literal(host_part(server_host.address))
    return literal or "127.0.0.1"


TRL_ASYNC = TrlAsync(
    name="trl-async",
    description="TRL async GRPO trainer + a vLLM server, adapters handed over through the shared volume",
    roles=("server", "trainer"),
    main_role="trainer",
    bringup="grpo_deploy.deploy.bringup.trl_async",
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
    logger_keys={"project": ("wandb",), "entity": ("wandb",)},  # WANDB_PROJECT/ENTITY: TRL's other loggers read none
    sections=COMMON_SECTIONS + ("trl", "vllm", "runtime"),
    checkpoint_layout="trl",
    reader_role="server",
    unreadable_share="vLLM would answer 404 and TRL would misreport it as 'does not expose /v1/load_lora_adapter'",
    single_host_roles=("server", "trainer"),
    multi_host_roles=(("trainer",), ("server",)),
    settings_roles={"vllm": "server"},
)
