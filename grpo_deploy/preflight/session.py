"""The preflight session: the spec's connectors, the facts read once from every host, the local engine's client and
the plan, shared by every check; where the checkpoints land and how much is free there (the plan is made from it).

Nothing here gives a verdict: the checks (grpo_deploy.preflight.host, .storage, .images, .spec) read this session.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from grpo_deploy.hosts import docker_api
from grpo_deploy.hosts import facts as host_facts
from grpo_deploy.hosts.connect import Host, HostError, SshOptions, connect, on_all
from grpo_deploy.names import RUN_LABEL
from grpo_deploy.plan import Plan, make_plan
from grpo_deploy.runtime.storage.checkpoints import QUARANTINE_DIR
from grpo_deploy.spec.resolve import Resolved


@dataclass
class Context:
    """One preflight (or status) session over a resolved spec: every check reads the hosts through it."""

    res: Resolved
    free_space: dict[str, int] = field(default_factory=dict)  # what-if free bytes per host, from --free-space
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    client: Any = None  # the local engine's client when the caller has one already (`up`); else made on first use
    ssh: SshOptions = field(default_factory=SshOptions)
    connectors: dict[str, Host] = field(default_factory=dict)  # by host name: a deployment's own (`up`), else made
    # on first use
    _docker_error: str | None = None
    _plan: Plan | None = None
    _facts: dict[str, Any] | None = None

    def connector(self, host) -> Host:
        """The connector of a spec host (made once, shared by every check)."""
        if host.name not in self.connectors:
            self.connectors[host.name] = connect(host, self.ssh)
        return self.connectors[host.name]

    def forget_facts(self) -> None:
        """Read the hosts' facts again on next use (`up`: the images are on the hosts now)."""
        self._facts = None

    def all_facts(self) -> dict[str, Any]:
        """Facts of every host (this machine's too, through its connector), read once and in parallel: {host name:
        facts dict, or the HostError that kept them from being read}."""
        if self._facts is None:
            hosts = {h.name: h for h in self.res.spec.hosts}
            self._facts = on_all([self.connector(h) for h in hosts.values()],
                                 lambda conn: _gather(self, hosts[conn.name], conn))
        return self._facts

    def facts_of(self, host) -> dict[str, Any] | HostError:
        """The gathered facts of one host, or the HostError that kept them from being read."""
        return self.all_facts()[host.name]

    @property
    def gathered(self) -> bool:
        """Whether the hosts' facts were read already (preflight) or not (status reads one fact alone)."""
        return self._facts is not None

    def close(self) -> None:
        for conn in self.connectors.values():
            conn.close()

    def docker(self):
        """The local engine's client, or None (the reason is kept in docker_error)."""
        if self.client is None and self._docker_error is None:
            try:
                self.client = docker_api.client()
            except docker_api.DockerUnavailable as exc:
                self._docker_error = str(exc)
        return self.client

    @property
    def docker_error(self) -> str | None:
        return self._docker_error

    def plan(self) -> Plan:
        if self._plan is None:
            free, fs, source = checkpoint_free_space(self)
            self._plan = make_plan(self.res, free, fs, source)
        return self._plan


def _gather(ctx: Context, host, conn: Host) -> dict[str, Any]:
    """Every fact the checks read about one host (raises HostError when it cannot be reached)."""
    res = ctx.res
    conn.connect()
    out: dict[str, Any] = {"reached": "this machine (no SSH)" if conn.is_local else f"ssh {host.address}",
                           "machine": host_facts.machine(conn), "docker": host_facts.docker_version(conn),
                           "compose": host_facts.compose_version(conn), "clock": host_facts.clock_offset(conn)}
    if res.profiles[host.name].accelerator == "cuda":
        out["gpus"] = host_facts.gpus(conn)
        out["driver"] = host_facts.nvidia_driver(conn)
    if host.shared_dir:
        out["shared_dir"] = host_facts.owner(conn, host.shared_dir)
    cluster = [h.name for h in res.engine_info.cluster_nodes(res)]
    if "server" in host.roles or host.name in cluster:
        ps = conn.run(["docker", "ps", "--format", "{{.Names}}", "--filter", f"label={RUN_LABEL}={res.spec.run.name}"])
        out["running"] = ps.out.split()
    if ports := res.engine_info.published_ports(res, host):  # e.g. each vLLM replica's
        out["listening"] = {port: host_facts.listening(conn, port) for port in ports}
    if host.name in cluster:  # a Ray node of several hosts: its addresses, Ray's ports, InfiniBand
        out["interfaces"] = host_facts.ipv4_addresses(conn)
        out["listening_ports"] = host_facts.listening_ports(conn)
        out["infiniband"] = host_facts.exists(conn, "/dev/infiniband")
        out["reached_at"] = host_facts.ssh_server_ip(conn)
    out["images"] = {key: host_facts.image(conn, res.images[key]) for key in image_roles(res, host)}
    if host.name == storage_host(res).name:
        out["free"] = host_facts.free_space(conn, storage_path(res, host, conn))
    return out


def image_roles(res: Resolved, host) -> list[str]:
    """The image keys a host needs: the images its roles run, each once (the engine says which)."""
    return res.engine_info.images_on(host.roles)


def storage_path(res: Resolved, host, conn: Host) -> str:
    """Where the checkpoints land on *host*'s own filesystem."""
    if host.shared_dir:
        return os.path.join(host.shared_dir, os.path.relpath(res.checkpoint_dir, res.spec.storage.mount))
    return host_facts.volume_mountpoint(conn, res.spec.storage.volume) or host_facts.docker_root(conn) or "/"


def storage_host(res: Resolved):
    """The host whose filesystem holds the checkpoints (NFS server's host, else the trainer/head host)."""
    return res.host_for(res.engine_info.main_role)


def checkpoint_free_space(ctx: Context) -> tuple[int | None, str, str]:
    """(free bytes, filesystem measured, how it was measured) for the checkpoint directory. What this run already
    has there (its checkpoints and adapters, not quarantine/) counts as free: the plan's peak counts them already, so
    a resume after the disk watchdog stopped the run is not refused for the very checkpoints it resumes from."""
    free, where, how = measured_free_space(ctx)
    if free is None or ctx.res.settings.checkpoints.dir is None or "--free-space" in how:
        return free, where, how
    own = _own_checkpoint_bytes(ctx)
    if own:
        free += own
        how += f", plus {own / 1e6:,.1f} MB of this run's own checkpoints and adapters already there"
    return free, where, how


def _own_checkpoint_bytes(ctx: Context) -> int:
    """Bytes on disk under the run's checkpoint directory, quarantine/ left out (0 when absent or unreadable)."""
    res = ctx.res
    host = storage_host(res)
    rel = os.path.relpath(res.checkpoint_dir, res.spec.storage.mount)
    if res.spec.storage.nfs is not None and not host.shared_dir:
        return 0  # measured on the NFS server, not here
    try:
        conn = ctx.connector(host)
        base = host.shared_dir or host_facts.volume_mountpoint(conn, res.spec.storage.volume)
        if not base:
            return 0
        r = conn.run(["du", "-s", "-B1", f"--exclude={QUARANTINE_DIR}", os.path.join(base, rel)])
    except HostError:
        return 0
    first = r.out.split()[0] if r.ok and r.out.split() else ""
    return int(first) if first.isdigit() else 0


def measured_free_space(ctx: Context) -> tuple[int | None, str, str]:
    """(free bytes, filesystem measured, how) where the checkpoints land: df on the host that holds them, through its
    connector (the figure preflight gathered, or this one fact alone for status)."""
    res = ctx.res
    host = storage_host(res)
    if host.name in ctx.free_space:
        return ctx.free_space[host.name], f"{host.name}:{res.checkpoint_dir}", "given with --free-space"
    if res.spec.storage.nfs is not None and not host.shared_dir:
        return (None, f"nfs {res.spec.storage.nfs.server}:{res.spec.storage.nfs.export}",
                "NFS export: measured on its server")
    if ctx.gathered:  # preflight gathered every fact already
        found = ctx.facts_of(host)
        free = found.get("free") if isinstance(found, dict) else None
    else:  # status: this one fact only
        try:
            conn = ctx.connector(host)
            free = host_facts.free_space(conn, storage_path(res, host, conn))
        except HostError:
            free = None
    if free is None:
        return None, f"{host.name}:{res.checkpoint_dir}", "host unreachable or df failed (see the reachable check)"
    where = free.path if ctx.connector(host).is_local else f"{host.name}:{free.path}"  # this machine's paths bare
    return free.free_bytes, where, "df on the host that holds the checkpoints"
