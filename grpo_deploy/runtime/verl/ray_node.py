"""One Ray node of a verl run inside the verl image: `ray start` for the head or a worker with the node's address,
resources and fixed ports, the network interface NCCL and Gloo use (`runtime/net.py`'s choice, set before Ray
starts, so every Ray worker inherits it), and the cluster's token on the share (every node presents the same one).
Ray's ports are fixed, not random, so preflight can check them free and reachable and a firewall can let exactly them
through."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from grpo_deploy.runtime.net import socket_interface

GCS_PORT = 6379
"""The head's GCS (what workers and the driver join)."""
NODE_PORTS = {"--node-manager-port": 6380, "--object-manager-port": 6381, "--dashboard-agent-grpc-port": 6382,
              "--metrics-export-port": 6383, "--runtime-env-agent-port": 6384, "--dashboard-agent-listen-port": 6385}
"""Ports every node listens on, fixed (Ray picks them at random otherwise)."""
WORKER_PORTS = (10002, 10999)
"""The range of Ray's worker processes' ports on every node (--min/--max-worker-port)."""
PEER_PORTS = (GCS_PORT, NODE_PORTS["--node-manager-port"], NODE_PORTS["--object-manager-port"])
"""The ports one node must reach on another: the head's GCS, every node's node and object managers."""
TOKEN_NAME = "ray-auth-token"
"""The cluster's token file in the run folder on the share (0600, the run user's)."""


@dataclass(frozen=True)
class NodeArgs:
    """What one node's `ray start` needs (the rendered host env, through the container's command line)."""

    role: str  # head | worker
    head: str = ""  # the head's GCS address, ip:port (workers; "" on a head alone)
    node_ip: str = ""  # this node's address ("": Ray's choice, one host)
    ifname: str = ""  # NCCL/Gloo interface ("": the one holding node_ip)
    num_cpus: int = 0
    num_gpus: int = 0
    object_store_bytes: int = 0
    cluster: bool = False  # several hosts: fixed ports, host networking


def start_argv(node: NodeArgs) -> list[str]:
    """`ray start` for *node* (resources 0: Ray counts them itself; logical GPUs on a CPU host satisfy verl's
    placement groups)."""
    argv = ["ray", "start", "--disable-usage-stats"]
    if node.role == "head":
        argv += ["--head", "--port", str(GCS_PORT), "--include-dashboard=false"]
    else:
        argv += ["--address", node.head, "--block"]
    if node.node_ip:
        argv += ["--node-ip-address", node.node_ip]
    if node.cluster:
        for flag, port in NODE_PORTS.items():
            argv += [flag, str(port)]
        argv += ["--min-worker-port", str(WORKER_PORTS[0]), "--max-worker-port", str(WORKER_PORTS[1])]
    for flag, value in (("--num-cpus", node.num_cpus), ("--num-gpus", node.num_gpus),
                        ("--object-store-memory", node.object_store_bytes)):
        if value:
            argv += [flag, str(value)]
    return argv


def socket_env(node: NodeArgs, addresses: dict[str, list[str]] | None = None) -> dict[str, str]:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for a node of a cluster: the interface named, else the one holding
    the node's address ({} on one host: loopback does). SystemExit with one line when neither can be found."""
    if not node.cluster or not (node.ifname or node.node_ip):
        return {}  # one host (loopback), or a hand-run render that names neither: Ray's and NCCL's own choice
    try:
        name = socket_interface(node.ifname, node.node_ip, addresses)
    except ValueError as error:
        raise SystemExit(f"verl node: {error}") from None
    return {"NCCL_SOCKET_IFNAME": name, "GLOO_SOCKET_IFNAME": name}


def ensure_token(path: Path, create: bool) -> Path:
    """The cluster's token file (0600; its value never printed): made by the head when missing, only read by a
    worker. SystemExit with one line when it is a link, not a regular file, or (a worker) not there."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            return path
    if path.is_symlink() or not path.is_file():
        what = "missing (the head makes it when it starts)" if not path.exists() and not path.is_symlink() else \
            "not a regular file (a link?): remove it"
        raise SystemExit(f"verl node: the Ray token {path} is {what}")
    return path


def ray_env(token: Path, address: str) -> dict[str, str]:
    """What every Ray process of the node and the driver need: token auth said explicitly (Ray 2.60's driver did not
    present a token otherwise and was refused), the shared token, the address to join."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_ADDRESS": address}
