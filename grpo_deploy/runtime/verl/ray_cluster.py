"""The Ray cluster of a verl run as the head sees it before verl starts: the nodes that joined and their GPUs and CPUs,
waited for up to a deadline, and the verdict against the spec (exactly nnodes nodes, nnodes x n_gpus_per_node GPUs,
at least 3 CPUs per GPU on every node: verl's placement bundles are {CPU: 3, GPU: 1} per GPU and its resource check
counts only GPUs, so a short node hangs in placement instead of failing). Runs inside the verl image."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

CPUS_PER_GPU = 3
"""Ray CPUs verl's STRICT_PACK bundles take per GPU."""


@dataclass(frozen=True)
class Node:
    """One alive Ray node: its address and the resources Ray counts for it."""

    ip: str
    gpus: float
    cpus: float


@dataclass(frozen=True)
class ClusterWant:
    """What the spec asks of the cluster."""

    nodes: int
    gpus_per_node: int
    cpus_per_gpu: int = CPUS_PER_GPU


@dataclass
class Verdict:
    ok: bool
    message: str
    nodes: list[Node] = field(default_factory=list)

    def counts(self) -> dict:
        return {"nodes": len(self.nodes), "gpus": sum(n.gpus for n in self.nodes),
                "cpus": sum(n.cpus for n in self.nodes), "node_ips": [n.ip for n in self.nodes]}


def alive_nodes(raw: list[dict]) -> list[Node]:
    """The alive nodes of `ray.nodes()` records."""
    out = []
    for record in raw:
        if not record.get("Alive"):
            continue
        resources = record.get("Resources") or {}
        out.append(Node(str(record.get("NodeManagerAddress", "?")), float(resources.get("GPU", 0)),
                        float(resources.get("CPU", 0))))
    return sorted(out, key=lambda n: n.ip)


def _num(x: float) -> str:
    return f"{x:g}"


def judge(nodes: list[Node], want: ClusterWant) -> Verdict:
    """The cluster against the spec, in one line with the numbers on both sides and what to do."""
    gpus, cpus = sum(n.gpus for n in nodes), sum(n.cpus for n in nodes)
    need_gpus = want.nodes * want.gpus_per_node
    seen = (f"Ray reports {len(nodes)} node(s), {_num(gpus)} GPU(s), {_num(cpus)} CPU(s) "
            f"({', '.join(f'{n.ip}: {_num(n.gpus)} GPU, {_num(n.cpus)} CPU' for n in nodes) or 'none'})")
    needed = (f"the spec needs exactly {want.nodes} node(s) x {want.gpus_per_node} GPU(s) = {need_gpus} GPU(s) and "
              f">= {want.cpus_per_gpu} CPUs per GPU")
    if len(nodes) < want.nodes:
        return Verdict(False, f"{seen}; {needed}: {want.nodes - len(nodes)} node(s) did not join — check that every "
                              "worker started and reaches the head (grpo-deploy logs --role worker)", nodes)
    if len(nodes) > want.nodes:
        return Verdict(False, f"{seen}; {needed}: {len(nodes) - want.nodes} node(s) too many joined — another "
                              "run's worker is attached to this head: stop it (grpo-deploy down there)", nodes)
    short = [n for n in nodes if n.gpus < want.gpus_per_node]
    if short:
        return Verdict(False, f"{seen}; {needed}: {', '.join(n.ip for n in short)} offer(s) fewer GPUs — check "
                              "CUDA_VISIBLE_DEVICES and the NVIDIA container toolkit there, or lower "
                              "overrides.verl.trainer.n_gpus_per_node", nodes)
    starved = [n for n in nodes if n.cpus < want.cpus_per_gpu * want.gpus_per_node]
    if starved:
        return Verdict(False, f"{seen}; {needed}: {', '.join(n.ip for n in starved)} offer(s) too few CPUs "
                              "(verl would hang in placement) — give those hosts more cores", nodes)
    return Verdict(True, f"{seen}: as the spec says", nodes)


def wait_for(read: Callable[[], list[Node]], want: ClusterWant, timeout_s: float,
             on_change: Callable[[list[Node]], None] = lambda _nodes: None, poll_s: float = 1.0,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Verdict:
    """Poll *read* until *want*.nodes nodes are alive or *timeout_s* passed, then judge what is there;
    *on_change* hears every new node count."""
    deadline = clock() + timeout_s
    last: list[Node] | None = None
    while True:
        nodes = read()
        if last is None or [n.ip for n in nodes] != [n.ip for n in last]:
            on_change(nodes)
        last = nodes
        if len(nodes) >= want.nodes or clock() >= deadline:
            return judge(nodes, want)
        sleep(poll_s)


def ray_reader(address: str) -> tuple[Callable[[], list[Node]], Callable[[], None]]:
    """(read the alive nodes, disconnect) through a Ray client session to the running cluster at *address*."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return (lambda: alive_nodes(ray.nodes())), ray.shutdown
