"""Checks of a cluster across hosts (verl's Ray cluster; TRL's trainer over several trainer hosts), before anything
starts: each node's address and the interface NCCL and Gloo will use, the engine's fixed ports free
(Engine.cluster_ports), /dev/infiniband passed through where the host has it, GPUs enough for verl's n_gpus_per_node
(`cluster`); then, once the image is on every host, each node reaching the first node (Ray's head, the trainer's
machine 0) and every other node on those ports over the real network (`cluster-reach`). Also the node addresses `up`
renders."""

from __future__ import annotations

import json
from dataclasses import dataclass

from grpo_deploy.common.values import host_part, ip_literal
from grpo_deploy.engines.base import ClusterPorts
from grpo_deploy.hosts.connect import HostError, on_all
from grpo_deploy.names import MANAGED
from grpo_deploy.preflight.images import image_on
from grpo_deploy.preflight.registry import FAIL, OK, SKIP, WARN, Result, check
from grpo_deploy.preflight.session import Context
from grpo_deploy.runtime.net import interface_of
from grpo_deploy.runtime.verl.ray_node import GCS_PORT

LISTEN_S = 45
"""How long each node's probe listener stays up (the connections are tried within it)."""


@dataclass(frozen=True)
class NodeAddress:
    ip: str
    interface: str


def _index(ctx: Context, host) -> int:
    return next(i for i, h in enumerate(ctx.res.spec.hosts) if h.name == host.name)


def node_address(ctx: Context, host) -> NodeAddress | Result:
    """The address a node's Ray advertises and the interface holding it: hosts[].interface's IPv4 address, else the
    host's IP address in the spec, else the address this machine reached it at over SSH. A Result (FAIL) when none
    can be told or it is not the host's own."""
    found = ctx.facts_of(host)
    i = _index(ctx, host)
    if isinstance(found, HostError):
        return Result("cluster", host.name, FAIL, f"cannot read the host: {found.what}", found.fix)
    addresses = found.get("interfaces")
    if addresses is None:
        return Result("cluster", host.name, FAIL, "cannot list its network interfaces (`ip -o -4 addr show`)",
                      "install iproute2 there")
    names = ", ".join(sorted(addresses)) or "none"
    if host.interface:
        ips = addresses.get(host.interface)
        if ips is None:
            return Result("cluster", host.name, FAIL, f"no network interface {host.interface!r} there (it has {names})",
                          f"set hosts[{i}].interface to the interface of the network the hosts share")
        if not ips:
            return Result("cluster", host.name, FAIL, f"interface {host.interface} has no IPv4 address",
                          f"bring it up with an address, or set hosts[{i}].interface to another ({names})")
        return NodeAddress(ips[0], host.interface)
    literal = ip_literal(host_part(host.address))
    ip = literal or found.get("reached_at")
    if ip is None:
        return Result("cluster", host.name, FAIL, "its address as the other nodes reach it is unknown (this machine, "
                      "or an SSH session without SSH_CONNECTION)",
                      f"set hosts[{i}].interface to the interface of the network the hosts share ({names})")
    interface = interface_of(ip, addresses)
    if interface is None or ip.startswith("127."):
        return Result("cluster", host.name, FAIL, f"{ip} (how it is reached from here) is not an address of one of "
                      f"its interfaces ({names}): NAT or a proxy in between",
                      f"set hosts[{i}].interface to the interface of the network the hosts share")
    return NodeAddress(ip, interface)


def node_addresses(ctx: Context) -> dict[str, NodeAddress]:
    """{host name: NodeAddress} of every node whose address could be told (the `cluster` check reports the others)."""
    out = {}
    for host in ctx.res.engine_info.cluster_nodes(ctx.res):
        address = node_address(ctx, host)
        if isinstance(address, NodeAddress):
            out[host.name] = address
    return out


NO_CLUSTER = "no cluster across hosts in this spec (several Ray nodes, or several trainer hosts)"


def _node_words(res, first: bool) -> str:
    """A node's part in words: Ray's head or worker, the trainer's machine 0 or another."""
    if res.engine_info.main_role == "head":
        return "head" if first else "worker"
    return "trainer machine 0 (rendezvous)" if first else "trainer machine"


@check("cluster", "Each node of a cluster across hosts (Ray's, or the trainer's over several hosts): its address and "
                  "NCCL/Gloo interface, its fixed ports free, /dev/infiniband passed through where the host has it, "
                  "GPUs for n_gpus_per_node")
def check_cluster(ctx: Context) -> list[Result]:
    nodes = ctx.res.engine_info.cluster_nodes(ctx.res)
    if not nodes:
        return [Result("cluster", "-", SKIP, NO_CLUSTER)]
    ports = ctx.res.engine_info.cluster_ports(ctx.res)
    out = []
    for n, host in enumerate(nodes):
        address = node_address(ctx, host)
        if isinstance(address, Result):
            out.append(address)
            continue
        found = ctx.facts_of(host)
        out.append(_ports(ctx, host, found, ports, first=n == 0)
                   or _infiniband(ctx, host, found) or _gpus(ctx, host, found)
                   or Result("cluster", host.name, OK, f"{_node_words(ctx.res, n == 0)} at {address.ip} on "
                             f"{address.interface} (NCCL/Gloo), {ports.what} ports free",
                             data={"ip": address.ip, "interface": address.interface}))
    return out


def _ports_words(ports: ClusterPorts, first: bool) -> str:
    ranges = [f"{low}-{high}" for low, high in ports.ranges]
    return " and ".join([", ".join(map(str, ports.listened(first)))] + ranges)


def _ports(ctx: Context, host, found: dict, ports: ClusterPorts, first: bool) -> Result | None:
    if found.get("running"):
        return Result("cluster", host.name, FAIL, f"run {ctx.res.spec.run.name} already has running containers there "
                      f"({', '.join(found['running'])})", "grpo-deploy down, or grpo-deploy status")
    listening = found.get("listening_ports")
    if listening is None:
        return Result("cluster", host.name, WARN, "cannot tell whether Ray's ports are free (`ss -ltn` did not "
                      "answer)", "install iproute2 there")
    taken = sorted(p for p in listening
                   if p in ports.listened(first) or any(low <= p <= high for low, high in ports.ranges))
    if taken:
        return Result("cluster", host.name, FAIL, f"{ports.what} port(s) {', '.join(map(str, taken))} are taken "
                      f"there (it needs {_ports_words(ports, first)})",
                      "stop what listens there (`ss -ltnp`), e.g. a Ray, Redis or trainer left running")
    return None


def _infiniband(ctx: Context, host, found: dict) -> Result | None:
    i = _index(ctx, host)
    if found.get("infiniband") and not host.infiniband:
        return Result("cluster", host.name, FAIL, "the host has /dev/infiniband but the container would not see it: "
                      "NCCL would fall back to TCP sockets without a word", f"set hosts[{i}].infiniband: true")
    if host.infiniband and not found.get("infiniband"):
        return Result("cluster", host.name, FAIL, "hosts[].infiniband is set but the host has no /dev/infiniband",
                      f"install the InfiniBand driver there, or remove hosts[{i}].infiniband")
    return None


def _gpus(ctx: Context, host, found: dict) -> Result | None:
    asked = ctx.res.engine_info.node_gpus(ctx.res)
    if ctx.res.profiles[host.name].accelerator != "cuda" or found.get("gpus") is None or asked is None:
        return None
    (want, setting, override), have = asked, len(found["gpus"])
    if have < want:
        return Result("cluster", host.name, FAIL, f"{have} GPU(s) there; {setting} is {want}",
                      f"lower {override} to the smallest host's GPU count")
    return None


@check("cluster-reach", "Each node of a cluster across hosts reaches the first node (Ray's head, the trainer's machine "
                        "0) and every other node on the cluster's ports (probe listeners on the real addresses)",
       needs_images=True)
def check_cluster_reach(ctx: Context) -> list[Result]:
    res = ctx.res
    nodes = res.engine_info.cluster_nodes(res)
    if not nodes:
        return [Result("cluster-reach", "-", SKIP, NO_CLUSTER)]
    addresses = node_addresses(ctx)
    if len(addresses) < len(nodes):
        return [Result("cluster-reach", "-", SKIP, "some node's address is unknown (the cluster check says why)")]
    image = res.image_for(res.engine_info.main_role)
    for host in nodes:
        present = image_on(ctx, host, image)
        if present is not True:
            return [Result("cluster-reach", host.name, SKIP, present or f"image {image} is not on {host.name} yet: "
                           "`up` ships it and probes then")]
    return _probe(ctx, nodes, addresses, image, res.engine_info.cluster_ports(res))


def _probe(ctx: Context, nodes: list, addresses: dict[str, NodeAddress], image: str,
           ports: ClusterPorts) -> list[Result]:
    user = ctx.res.identities[ctx.res.engine_info.main_role].user
    name = f"grpo-netprobe-{ctx.res.spec.run.name}"
    head = nodes[0].name

    def probe(*extra: str) -> list[str]:
        """`docker run` of the netprobe on the host's network as the run user (*extra*: -d, --name ...)."""
        return ["docker", "run", *extra, "--rm", "--network", "host", "--user", user, "--label", MANAGED, image,
                "python3", "-m", "grpo_deploy.runtime.netprobe"]

    def start_listener(conn) -> Result | None:
        listened = ports.listened(conn.name == head)
        if not listened:
            return None
        r = conn.run(probe("-d", "--name", name) + ["listen", "--ip", addresses[conn.name].ip, "--ports",
                                                     ",".join(map(str, listened)), "--seconds", str(LISTEN_S)],
                     timeout=120)
        return None if r.ok else Result("cluster-reach", conn.name, FAIL, f"cannot start the probe listener: "
                                        f"{r.line()}", "see the image and the Docker engine there")

    def targets_for(host_name: str) -> list[str]:
        return [f"{addresses[n.name].ip}:{port}" for n in nodes if n.name != host_name
                for port in (ports.reach_first if n.name == head else ports.reach_all)]

    def connect(conn) -> dict | Result:
        if not targets_for(conn.name):
            return {}
        r = conn.run(probe() + ["connect", "--targets", ",".join(targets_for(conn.name))], timeout=120)
        try:
            return json.loads(r.out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return Result("cluster-reach", conn.name, FAIL, f"the probe did not answer: {r.line()}",
                          "see the image and the Docker engine there")

    conns = [ctx.connector(h) for h in nodes]
    try:
        started = on_all(conns, start_listener)
        out = [r for r in started.values() if isinstance(r, (Result, HostError))]
        if out:
            return [r if isinstance(r, Result) else Result("cluster-reach", r.host, FAIL, r.what, r.fix) for r in out]
        reached = on_all(conns, connect)
    finally:
        on_all(conns, lambda conn: conn.run(["docker", "rm", "-f", name], timeout=60))
    return [_verdict(n, reached[n.name], addresses, ports) for n in nodes]


def _verdict(host, reached, addresses: dict[str, NodeAddress], ports: ClusterPorts) -> Result:
    if isinstance(reached, HostError):
        return Result("cluster-reach", host.name, FAIL, reached.what, reached.fix)
    if isinstance(reached, Result):
        return reached
    by_ip = {a.ip: n for n, a in addresses.items()}
    failed = {t: why for t, why in reached.items() if why != "ok"}
    if not failed:
        return Result("cluster-reach", host.name, OK, f"reaches {', '.join(sorted(reached))}" if reached else
                      "nothing to reach from here (the others reach it)")
    target, why = next(iter(failed.items()))
    ip, _, port = target.rpartition(":")
    what = "the Ray head's GCS" if int(port) == GCS_PORT and ports.what == "Ray's" else f"{ports.what} ports"
    every = sorted(set(ports.reach_first) | set(ports.reach_all))
    return Result("cluster-reach", host.name, FAIL,
                  f"cannot reach {what} on {by_ip.get(ip, ip)} at {target}: {why}"
                  + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""),
                  f"let TCP {', '.join(map(str, every))}"
                  + "".join(f" and {low}-{high}" for low, high in ports.ranges)
                  + " through between the hosts (firewall), or set hosts[].interface to the network they share")
