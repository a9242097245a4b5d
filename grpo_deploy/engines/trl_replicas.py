"""The trl-async engine's vLLM servers: the GPU split of a host (server and trainer), each replica (its host, compose
service, place and GPUs), the URLs the trainer and the replica proxy reach them by, the proxy's arguments, each host's
replica services, where the server's port is published and the kit's front before a server that faces other hosts
(its services and arguments)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from grpo_deploy.common.values import MAX_PORT, host_part, ip_literal
from grpo_deploy.engines.base import Engine, Resolved
from grpo_deploy.engines.trl_trainers import trainer_machines
from grpo_deploy.names import COMPOSE_BASE, COMPOSE_FRONT, FRONT_SERVICE, PROXY_SERVICE, REPLICA_LABEL, ROLE_LABEL
from grpo_deploy.runtime.storage.adapters import LORA_SUBDIR
from grpo_deploy.templating import dump_yaml


def gpu_split(res: Resolved, host) -> dict[str, list[int]]:
    """The trl-async engine's GPU split of *host* (TrlAsync.gpu_split): the spec's hosts[].gpus, else server on GPU 0
    and the trainer on the rest when both roles share a host
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
        gpus = gpu_split(res, host).get("server", [])
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


def fronted(res: Resolved, host) -> bool:
    """Whether *host*'s vLLM servers face other hosts (a server host apart from the trainer's: the trainer reaches
    them by the host's address), so that each gets the kit's front: the replica proxy asking for the run's token,
    published where the server was, the server itself published nowhere. A server beside the trainer is reached on
    the host's own compose network (or loopback) and keeps the direct path: no front, no extra hop."""
    trainer = res.host_for("trainer")
    return "server" in host.roles and (trainer is None or host.name != trainer.name)


def front_service(place: int) -> str:
    """The compose service of the front before a host's replica at *place*: `front`, then `front-2`, ..."""
    return FRONT_SERVICE if place == 0 else f"{FRONT_SERVICE}-{place + 1}"


def front_services(res: Resolved, host_name: str, services: list[str]) -> list[str]:
    """The fronts of the replica *services* of host *host_name* ([] when that host has none)."""
    host = next(h for h in res.spec.hosts if h.name == host_name)
    if not fronted(res, host):
        return []
    return [front_service(r.place) for r in server_replicas(res) if r.host == host_name and r.service in services]


def any_front(res: Resolved) -> bool:
    return any(fronted(res, host) for host in res.spec.hosts)


def front_args(res: Resolved) -> list[str]:
    """The fronts' shared command line (config/front.args; each front's compose command adds its --replica): it
    listens on vLLM's port in its own container, published where the server was, refuses to start without the run's
    token and passes on an adapter load only from the run's adapter folder."""
    return ["--listen", f"0.0.0.0:{res.settings.vllm.port}", "--adapter-dir", adapter_dir(res), "--require-token"]


def pod_vllm_port(res: Resolved) -> int:
    """On Kubernetes, the port vLLM listens on inside the server pod, on loopback only: vllm.port + 1 (vllm.port - 1
    when vllm.port is the last port), because the front takes vllm.port on the pod's address (the Service's target)
    and one port cannot be bound on 0.0.0.0 and on 127.0.0.1 at once."""
    port = res.settings.vllm.port
    return port + 1 if port < MAX_PORT else port - 1


def k8s_front_args(res: Resolved) -> list[str]:
    """The front's command line in a Kubernetes server pod (k8s/front.args): the compose fronts' (front_args) and the
    one replica it stands before, vLLM on the pod's loopback (the Kubernetes overlays run one server)."""
    return [*front_args(res), "--replica", f"http://127.0.0.1:{pod_vllm_port(res)}"]


def host_services(res: Resolved, host) -> list[str]:
    """The compose services *host* runs, in start order: its server replicas (each with its front when they face
    other hosts), then the replica proxy (beside the trainer, when the run has several replicas) and the trainer."""
    mine = [r.service for r in server_replicas(res) if r.host == host.name]
    out = mine + front_services(res, host.name, mine)
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


def adapter_dir(res: Resolved) -> str:
    """Where the trainer publishes its adapter versions (runtime/trainer/config.py's lora_dir: the rendered
    adapters.dir, the checkpoint folder, and TRL's `.vllm_lora`), as the proxy sees it: it mounts the share at the
    same path."""
    return posixpath.normpath(posixpath.join(res.checkpoint_dir, LORA_SUBDIR))


def proxy_args(res: Resolved, resolved: dict[str, str] | None = None) -> list[str]:
    """The replica proxy's command line, one argument per line of config/proxy.args (argparse's @file): it
    listens on vLLM's port in its own container, where the trainer's base URL points, and passes on an adapter load
    only from the run's adapter folder."""
    return ["--listen", f"0.0.0.0:{res.settings.vllm.port}", "--adapter-dir", adapter_dir(res),
            *(["--require-token"] if any_front(res) else []),  # it reaches the fronts with the run's token
            *(arg for url in replica_urls(res, resolved) for arg in ("--replica", url))]


def replicas_override(res: Resolved, host) -> str:
    """hosts/<host>.replicas.yaml: each replica after the first a service like `server` (compose's extends), with
    its own published port and labels; on a fronted host the replica publishes nothing and its front (like `front`)
    takes the port and points at it."""
    port, services, front = res.settings.vllm.port, {}, fronted(res, host)
    for r in (r for r in server_replicas(res) if r.host == host.name and r.place):
        published = [f"${{GRPO_SERVER_PUBLISH:-127.0.0.1}}:{port + r.place}:{port}"]
        services[r.service] = {
            "extends": {"file": COMPOSE_BASE, "service": "server"},
            "ports": [] if front else published,
            "labels": {REPLICA_LABEL: str(r.place + 1)},
        }
        if front:
            services[front_service(r.place)] = {
                "extends": {"file": COMPOSE_FRONT, "service": FRONT_SERVICE},
                "command": ["python3", "-m", "grpo_deploy.runtime.serving.proxy", "@/etc/grpo-deploy/front.args",
                            "--replica", f"http://{r.service}:{port}"],
                "ports": published,
                "labels": {REPLICA_LABEL: str(r.place + 1), ROLE_LABEL: "front"},
            }
    header = (f"# vLLM server replicas of host {host.name} beyond the first, rendered by grpo-deploy: each like "
              f"`server`, on its own published port{' (through its front, like `front`)' if front else ''}.\n")
    return dump_yaml(header, {"services": services}).replace("ports:\n", "ports: !override\n") \
        .replace("ports: []\n", "ports: !reset []\n")



def check_replicas(engine: Engine, res: Resolved, problem) -> None:
    """Several replicas: on a GPU host each replica needs GPUs of its own, as many each."""
    for i, host in enumerate(res.spec.hosts):
        n = host.replicas or 1
        gpus = engine.gpu_split(res, host).get("server")
        if n > 1 and gpus is not None and (len(gpus) < n or len(gpus) % n):
            problem(("hosts", i, "replicas"), f"{n} replicas on host {host.name} need their own GPUs, as many each: "
                    f"its server has {len(gpus)} ({gpus}); set hosts[{i}].gpus.server to {n} GPUs (or a multiple), "
                    f"or replicas to {len(gpus) or 1}")


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
