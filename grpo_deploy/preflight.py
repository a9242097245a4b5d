"""Preflight: named checks, each reading a fact and giving a verdict and a fix hint; table/JSON output; exit codes.

A check is a small function `(Context) -> list[Result]`. Checks never change a host: the one that needs to
write (the shared-volume permission probe) writes only a probe file under the run's own directory and
removes it. Exit codes: 0 every check passed (warnings allowed), 1 a check failed, 2 preflight could not run.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from . import compose, facts, image_tags
from .hosts import engine, oneoff
from .hosts import facts as host_facts
from .hosts.connect import Host, HostError, SshOptions, connect, on_all
from .names import CUDA_LABEL, GID_LABEL, RUN_LABEL, UID_LABEL, VLLM_VERSION_LABEL
from .plan import Plan, make_plan
from .resolve import Resolved
from .runtime.checkpoints import QUARANTINE_DIR
from .runtime.table import table

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2
TRL_VLLM_GATE = ((0, 22, 0), (0, 31, 0))  # trl 1.16.0: vllm>=0.22.0,<=0.31.0
CLOCK_TOLERANCE_S = 5.0  # hosts whose clocks disagree more than this make logs and checkpoint times misleading
# The oldest driver branch each CUDA major runs on (NVIDIA's CUDA compatibility: CUDA 12.x R525, CUDA 13.x R580).
MIN_DRIVER = {12: 525, 13: 580}
# GPUs with CUDA forward compatibility (datacenter parts): an older driver can run a newer CUDA through the
# image's compat libraries, which vLLM turns on with VLLM_ENABLE_CUDA_COMPATIBILITY=1.
DATACENTER_GPUS = ("A100", "A30", "A40", "A10", "A16", "A2", "H100", "H200", "H800", "H20", "GH200", "B200", "B300",
                   "GB200", "GB300", "L40", "L4", "L20", "V100", "T4")
COMPAT_ENV = "VLLM_ENABLE_CUDA_COMPATIBILITY"


@dataclass
class Result:
    check: str
    host: str
    verdict: str
    fact: str
    hint: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    res: Resolved
    free_space: dict[str, int] = field(default_factory=dict)  # what-if free bytes per host, from --free-space
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    client: Any = None  # the local engine's client when the caller has one already (`up`); else made on first use
    ssh: SshOptions = field(default_factory=SshOptions)
    _docker_error: str | None = None
    _plan: Plan | None = None
    _connectors: dict[str, Host] = field(default_factory=dict)
    _remote: dict[str, Any] | None = None

    def connector(self, host) -> Host:
        """The connector of a spec host (made once, shared by every check)."""
        if host.name not in self._connectors:
            self._connectors[host.name] = connect(host, self.ssh)
        return self._connectors[host.name]

    def remote(self) -> dict[str, Any]:
        """Facts of every remote host, read once and in parallel: {host name: facts dict, or the HostError}."""
        if self._remote is None:
            hosts = {h.name: h for h in self.res.spec.hosts if h.address != "local"}
            self._remote = on_all([self.connector(h) for h in hosts.values()],
                                  lambda conn: _gather(self, hosts[conn.name], conn))
        return self._remote

    def close(self) -> None:
        for conn in self._connectors.values():
            conn.close()

    def docker(self):
        """The local engine's client, or None (the reason is kept in docker_error)."""
        if self.client is None and self._docker_error is None:
            try:
                self.client = engine.client()
            except engine.DockerUnavailable as exc:
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
    """Every fact the checks read about one remote host (raises HostError when it cannot be reached)."""
    res = ctx.res
    conn.connect()
    out: dict[str, Any] = {"machine": host_facts.machine(conn), "docker": host_facts.docker_version(conn),
                           "compose": host_facts.compose_version(conn), "clock": host_facts.clock_offset(conn)}
    if res.profiles[host.name].accelerator == "cuda":
        out["gpus"] = host_facts.gpus(conn)
        out["driver"] = host_facts.nvidia_driver(conn)
    if host.shared_dir:
        out["shared_dir"] = host_facts.owner(conn, host.shared_dir)
    if "server" in host.roles:
        out["listening"] = host_facts.listening(conn, res.settings.vllm.port)
        ps = conn.run(["docker", "ps", "-q", "--filter", f"label={RUN_LABEL}={res.spec.run.name}"])
        out["running"] = ps.out.split()
    out["images"] = {key: host_facts.image(conn, res.images[key]) for key in _image_roles(res, host)}
    if host.name == _storage_host(res).name:
        out["free"] = host_facts.free_space(conn, _storage_path(res, host, conn))
    return out


def _image_roles(res: Resolved, host) -> list[str]:
    """The image keys a host needs: the images its roles run, each once (the engine says which)."""
    return res.engine_info.images_on(host.roles)


def _storage_path(res: Resolved, host, conn: Host) -> str:
    """Where the checkpoints land on *host*'s own filesystem."""
    if host.shared_dir:
        return os.path.join(host.shared_dir, os.path.relpath(res.checkpoint_dir, res.spec.storage.mount))
    return host_facts.volume_mountpoint(conn, res.spec.storage.volume) or host_facts.docker_root(conn) or "/"


def _facts_of(ctx: Context, host) -> dict[str, Any] | HostError:
    return ctx.remote()[host.name]


Check = Callable[[Context], list[Result]]
CHECKS: list[tuple[str, str, Check]] = []


def check(name: str, description: str):
    def register(fn: Check) -> Check:
        CHECKS.append((name, description, fn))
        return fn

    return register


def _storage_host(res: Resolved):
    """The host whose filesystem holds the checkpoints (NFS server's host, else the trainer/head host)."""
    return res.host_for(res.engine_info.main_role)


def checkpoint_free_space(ctx: Context) -> tuple[int | None, str, str]:
    """(free bytes, filesystem measured, how it was measured) for the checkpoint directory. What this run already
    has there (its checkpoints and adapters, not quarantine/) counts as free: the plan's peak counts them already, so
    a resume after the disk watchdog stopped the run is not refused for the very checkpoints it resumes from."""
    free, where, how = _measured_free_space(ctx)
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
    host = _storage_host(res)
    rel = os.path.relpath(res.checkpoint_dir, res.spec.storage.mount)
    if res.spec.storage.nfs is not None and not host.shared_dir:
        return 0  # measured on the NFS server, not here
    if host.address != "local":
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
    if host.shared_dir:
        base = host.shared_dir
    else:
        client = ctx.docker()
        base = facts.volume_mountpoint(client, res.spec.storage.volume) if client is not None else None
    return facts.tree_bytes(os.path.join(base, rel), skip=(QUARANTINE_DIR,)) if base else 0


def _measured_free_space(ctx: Context) -> tuple[int | None, str, str]:
    res = ctx.res
    host = _storage_host(res)
    if host.name in ctx.free_space:
        return ctx.free_space[host.name], f"{host.name}:{res.checkpoint_dir}", "given with --free-space"
    if host.address != "local":
        if ctx._remote is not None:  # preflight gathered every fact already
            found = _facts_of(ctx, host)
            free = found.get("free") if isinstance(found, dict) else None
        else:  # status: this one fact only
            try:
                conn = ctx.connector(host)
                free = host_facts.free_space(conn, _storage_path(res, host, conn))
            except HostError:
                free = None
        if free is None:
            return None, f"{host.name}:{res.checkpoint_dir}", "remote host unreachable (see the reachable check)"
        return free.free_bytes, f"{host.name}:{free.path}", "df on the host that holds the checkpoints"
    if host.shared_dir:
        rel = os.path.relpath(res.checkpoint_dir, res.spec.storage.mount)
        d = facts.disk_free(os.path.join(host.shared_dir, rel))
        return d.free_bytes, d.path, "statvfs of the shared directory on this host"
    if res.spec.storage.nfs is not None:
        return (None, f"nfs {res.spec.storage.nfs.server}:{res.spec.storage.nfs.export}",
                "NFS export: measured on its server")
    client = ctx.docker()
    if client is None:
        return None, f"docker volume {res.spec.storage.volume}", f"Docker engine unreachable ({ctx.docker_error})"
    where = facts.volume_mountpoint(client, res.spec.storage.volume) or facts.docker_info(client)["root_dir"]
    d = facts.disk_free(where)
    return d.free_bytes, d.path, f"statvfs of the Docker volume {res.spec.storage.volume} (local engine)"


def checkpoint_headroom(ctx: Context) -> dict[str, Any] | None:
    """For a running run (status): free space where checkpoints are written against the next checkpoint plus the
    margin. None when the model's size or the free space is unknown."""
    free, filesystem, source = _measured_free_space(ctx)  # what is free now: the run's own checkpoints are not
    # free for the next save (one measurement: status stays quick)
    disk = make_plan(ctx.res, free, filesystem, source).disk if free is not None else None
    if disk is None:
        return None
    need = disk.checkpoint_bytes + disk.margin_bytes
    return {"filesystem": disk.filesystem, "free_bytes": free, "checkpoint_bytes": disk.checkpoint_bytes,
            "margin_bytes": disk.margin_bytes, "ok": free >= need}


def headroom_text(h: dict[str, Any] | None) -> str:
    if h is None:
        return "  checkpoint disk     free space unknown (grpo-deploy preflight says why)"
    line = (f"  checkpoint disk     {h['free_bytes'] / 1e9:.1f} GB free; next checkpoint "
            f"{h['checkpoint_bytes'] / 1e9:.2f} GB + {h['margin_bytes'] / 1e9:.1f} GB margin ({h['filesystem']})")
    warning = "\n  WARNING: the next checkpoint may not fit: free space, or lower checkpoints.keep"
    return line if h["ok"] else line + warning


@check("spec", "The spec validates and every cross-field rule holds")
def check_spec(ctx: Context) -> list[Result]:
    # Reaching this point means load + resolve succeeded; invalid specs never get a Context.
    res = ctx.res
    hosts = ", ".join(f"{h.name}({'+'.join(h.roles)})" for h in res.spec.hosts)
    return [Result("spec", "-", OK, f"{res.spec.engine} on {hosts}, shared volume at {res.spec.storage.mount}")]


@check("identity", "Trainer and server run as the same non-root UID/GID with a umask that keeps files readable")
def check_identity(ctx: Context) -> list[Result]:
    res = ctx.res
    roles = res.engine_info.roles
    ids = {r: res.identities[r] for r in roles}
    first, second = ids[roles[0]], ids[roles[1]]
    if (first.uid, first.gid) != (second.uid, second.gid):
        return [Result(
            "identity", "-", FAIL,
            f"{roles[1]} runs as UID {second.uid}:{second.gid} umask {second.umask}, {roles[0]} as UID "
            f"{first.uid}:{first.gid}: adapter_model.safetensors is written 0600 (safetensors 0.8.0, whatever the "
            f"umask), so the {roles[0]} cannot read {res.checkpoint_dir}/... and vLLM answers 404 (TRL reports "
            "'does not expose /v1/load_lora_adapter')",
            "remove run.roles overrides so both roles run as run.uid/run.gid")]
    bad = [f"{r} umask {i.umask}" for r, i in ids.items() if int(i.umask, 8) & 0o700]
    if bad:
        return [Result("identity", "-", FAIL, f"{', '.join(bad)} denies the run user itself",
                       "use umask 0022 (or 0002)")]
    return [Result("identity", "-", OK, f"both roles run as {first.uid}:{first.gid}, umask {first.umask}")]


@check("reachable", "Every host answers over SSH with a verified host key (this machine needs none)")
def check_reachable(ctx: Context) -> list[Result]:
    out = []
    for host in ctx.res.spec.hosts:
        if host.address == "local":
            out.append(Result("reachable", host.name, OK, "this machine (no SSH)"))
            continue
        found = _facts_of(ctx, host)
        if isinstance(found, HostError):
            out.append(Result("reachable", host.name, FAIL, found.what, found.fix))
        else:
            out.append(Result("reachable", host.name, OK, f"ssh {host.address}: {found['machine']}"))
    return out


@check("clock", f"Host clocks agree within {CLOCK_TOLERANCE_S:.0f} s (logs, checkpoints and metrics are compared "
                "across hosts)")
def check_clock(ctx: Context) -> list[Result]:
    out = []
    for host in ctx.res.spec.hosts:
        found = _facts_of(ctx, host) if host.address != "local" else {"clock": 0.0}
        if isinstance(found, HostError):
            continue
        offset = found.get("clock")
        if offset is None:
            out.append(Result("clock", host.name, WARN, "could not read the clock (date +%s.%N)"))
        elif abs(offset) > CLOCK_TOLERANCE_S:
            out.append(Result("clock", host.name, FAIL, f"clock is {offset:+.1f} s off this machine's",
                              "enable NTP on every host (timedatectl set-ntp true)"))
        else:
            out.append(Result("clock", host.name, OK, f"{offset:+.2f} s from this machine"))
    return out


@check("docker", "The Docker engine (and Compose v2 on remote hosts) answers on every host that runs containers")
def check_docker(ctx: Context) -> list[Result]:
    out = []
    for host in ctx.res.spec.hosts:
        if host.address != "local":
            found = _facts_of(ctx, host)
            if isinstance(found, HostError):
                continue
            version, why = found["docker"]
            if version is None:
                out.append(Result("docker", host.name, FAIL, f"no Docker engine answers for the login user: {why}",
                                  "start Docker there and add the SSH user to the docker group"))
            elif found["compose"] is None:
                out.append(Result("docker", host.name, FAIL, f"engine {version} but no `docker compose` (Compose v2)",
                                  "install the docker-compose-plugin package there"))
            else:
                out.append(Result("docker", host.name, OK, f"engine {version}, compose {found['compose']}"))
            continue
        client = ctx.docker()
        if client is None:
            out.append(Result("docker", host.name, FAIL, f"no Docker engine answers: {ctx.docker_error}",
                              "start it (systemctl start docker, or dockerd &) and check DOCKER_HOST"))
            continue
        info = facts.docker_info(client)
        out.append(Result("docker", host.name, OK, f"engine {info['server_version']} ({info['architecture']}), "
                                                     f"root {info['root_dir']}", data=info))
    return out


@check("arch", "Each host's machine type and accelerator match its profile")
def check_arch(ctx: Context) -> list[Result]:
    out = []
    for host in ctx.res.spec.hosts:
        profile = ctx.res.profiles[host.name]
        if host.address != "local":
            found = _facts_of(ctx, host)
            if not isinstance(found, HostError):
                out.append(_remote_arch(host, profile, found))
            continue
        machine = os.uname().machine
        allowed = profile.hardware.get("arch") or []
        if machine not in allowed:
            out.append(Result("arch", host.name, FAIL, f"this machine is {machine}; profile {profile.name} is for "
                                                         f"{', '.join(allowed)}", "pick the profile of this hardware"))
        elif profile.accelerator == "cuda" and not os.path.exists("/dev/nvidiactl"):
            out.append(Result("arch", host.name, FAIL, f"profile {profile.name} needs an NVIDIA GPU; none here "
                                                         "(/dev/nvidiactl missing)", "use the cpu profile to rehearse"))
        else:
            out.append(Result("arch", host.name, OK, f"{machine}, accelerator {profile.accelerator}"))
    return out


def _remote_arch(host, profile, found: dict[str, Any]) -> Result:
    machine, allowed = found["machine"], profile.hardware.get("arch") or []
    if machine not in allowed:
        return Result("arch", host.name, FAIL, f"the host is {machine}; profile {profile.name} is for "
                                               f"{', '.join(allowed)}", "pick the profile of that hardware")
    if profile.accelerator != "cuda":
        return Result("arch", host.name, OK, f"{machine}, no accelerator needed")
    gpus = found.get("gpus")
    if not gpus:
        return Result("arch", host.name, FAIL, f"profile {profile.name} needs an NVIDIA GPU; nvidia-smi found none",
                      "install the NVIDIA driver and container toolkit (ansible/ roles)")
    want = profile.hardware.get("gpu_name_contains")
    if want and not any(want.lower() in g.name.lower() for g in gpus):
        return Result("arch", host.name, FAIL, f"GPUs are {', '.join(sorted({g.name for g in gpus}))}; profile "
                                               f"{profile.name} is tuned for {want}", "pick the profile of that GPU")
    return Result("arch", host.name, OK, f"{machine}, {len(gpus)} x {gpus[0].name} (sm {gpus[0].compute_capability})")


@check("port", "The vLLM server's published port is free on the server host")
def check_port(ctx: Context) -> list[Result]:
    import socket

    res = ctx.res
    server = res.host_for("server")
    if server is None:
        return [Result("port", "-", SKIP, f"{res.engine} has no server role")]
    port = res.settings.vllm.port
    if server.address != "local":
        found = _facts_of(ctx, server)
        if isinstance(found, HostError):
            return []
        if found.get("running"):
            return [Result("port", server.name, FAIL, f"run {res.spec.run.name} already has running containers there",
                           "grpo-deploy down, or grpo-deploy status")]
        if found.get("listening"):
            return [Result("port", server.name, FAIL, f"something already listens on port {port} there",
                           "stop it, or set overrides: {vllm: {port: 8100}}")]
        return [Result("port", server.name, OK, f"port {port} is free")]
    client = ctx.docker()
    mine = compose.containers(client, res.spec.run.name, all_=False) if client else []
    if mine:
        return [Result("port", server.name, FAIL, f"run {res.spec.run.name} already has running containers "
                       f"({', '.join(c.name for c in mine)})", "grpo-deploy down, or grpo-deploy status")]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return [Result("port", server.name, FAIL, f"port {port} is already in use on this host ({exc.strerror})",
                           "stop what listens there, or set overrides: {vllm: {port: 8100}}")]
    return [Result("port", server.name, OK, f"port {port} is free")]


@check("disk", "Checkpoints x (retention + 1) + adapters + margin fit the free space where they are written")
def check_disk(ctx: Context) -> list[Result]:
    plan = ctx.plan()
    host = _storage_host(ctx.res).name
    disk = plan.disk
    if disk is None:
        return [Result("disk", host, WARN, "; ".join(plan.warnings), "set model.architecture in the spec")]
    if disk.fits is None:
        return [Result("disk", host, SKIP, f"free space of {disk.filesystem} unknown ({disk.free_source}); "
                                            f"need {disk.peak_bytes / 1e9:.1f} GB")]
    data = {"need_bytes": disk.peak_bytes, "free_bytes": disk.free_bytes, "filesystem": disk.filesystem}
    if disk.fits:
        return [Result("disk", host, OK, f"need {disk.peak_bytes / 1e9:.1f} GB at peak, {disk.free_bytes / 1e9:.1f} GB "
                                          f"free on {disk.filesystem}", data=data)]
    return [Result("disk", host, FAIL, disk.explanation[-2], disk.explanation[-1], data=data)]


@check("logger", "Credentials for the chosen logger exist before any model is loaded")
def check_logger(ctx: Context) -> list[Result]:
    kind, env = ctx.res.spec.logger.kind, ctx.environ
    if kind == "wandb":
        mode = env.get("WANDB_MODE", "")
        if mode in ("offline", "disabled"):
            return [Result("logger", "-", OK, f"wandb in {mode} mode: no key needed")]
        if facts.env_set("WANDB_API_KEY", env) or facts.netrc_has("api.wandb.ai"):
            return [Result("logger", "-", OK, "W&B key found (WANDB_API_KEY or ~/.netrc); it is passed at start, "
                                              "never written to rendered files")]
        return [Result("logger", "-", FAIL,
                       "logger.kind is wandb but no W&B key: WANDB_API_KEY unset and no api.wandb.ai in ~/.netrc. "
                       "The trainer would load the model first and crash minutes later, after the GPUs were already "
                       "paid for",
                       "export WANDB_API_KEY=... (or run `wandb login`), or WANDB_MODE=offline, or logger.kind: jsonl")]
    if kind == "mlflow" and not facts.env_set("MLFLOW_TRACKING_URI", env):
        return [Result("logger", "-", WARN, "MLFLOW_TRACKING_URI unset: metrics go to a local sqlite file",
                       "export MLFLOW_TRACKING_URI=http://...")]
    return [Result("logger", "-", OK, f"logger {kind}: no credentials needed")]


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("+")[0].split("."):
        digits = "".join(c for c in p if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


@check("images", "Images exist (or will be built), run as the run UID, and trainer/server carry the same vLLM")
def check_images(ctx: Context) -> list[Result]:
    res = ctx.res
    client = ctx.docker()  # this machine's engine: local hosts run from it, remote hosts get images shipped from it
    out, versions = [], {}
    for host, role, tag in _images_needed(res):
        here = facts.image_labels(client, tag) if client is not None else None
        labels, shipped = here, ""
        if host.address != "local":
            found = _facts_of(ctx, host)
            if isinstance(found, HostError):
                continue
            there = (found["images"].get(role) or {}).get("labels") if found["images"].get(role) else None
            labels = there if there is not None else here
            shipped = "" if there is not None else f" (not on {host.name} yet: `up` ships it from this machine)"
        label = f"{role}@{host.name}"
        if labels is None:
            verdict = WARN if res.spec.images.build else FAIL
            where = "this machine's engine" if host.address == "local" else f"{host.name} or this machine"
            out.append(Result("images", label, verdict, f"{tag} is not on {where}",
                              "`grpo-deploy up` builds it (images.build: true), or `make images`"
                              if res.spec.images.build else "build or load it, or set images.build: true"))
            continue
        uid, gid = labels.get(UID_LABEL), labels.get(GID_LABEL)
        ident = res.identities.get(role) or res.main_identity
        versions[role] = labels.get(VLLM_VERSION_LABEL, "?")
        if uid is not None and (int(uid), int(gid or -1)) != (ident.uid, ident.gid):
            out.append(Result("images", label, FAIL,
                              f"{tag} was built for UID {uid}:{gid}, the run uses {ident.uid}:{ident.gid}: the "
                              "container user would have no passwd entry or HOME (PyTorch's getpass crashes)",
                              f"rebuild with --uid {ident.uid} --gid {ident.gid} or set run.uid/run.gid to the "
                              "image's"))
        else:
            out.append(Result("images", label, OK, f"{tag}: user {uid}:{gid}, vLLM {versions[role]}{shipped}"))
    if res.engine_info.server_role and len(versions) == 2:
        server_v, trainer_v = versions["server"], versions["trainer"]
        if server_v != trainer_v:
            out.append(Result("images", "vllm-version", FAIL,
                              f"trainer image has vLLM {trainer_v}, server {server_v}: TRL picks its weight-sync API "
                              "by the local vLLM version and would call an API the server does not have",
                              "build the trainer FROM the server image"))
        else:
            low, high = TRL_VLLM_GATE
            v = _version_tuple(server_v)
            if not v or (v < low):
                out.append(Result("images", "vllm-version", FAIL,
                                  f"vLLM {server_v!r} reads as older than TRL 1.16's minimum 0.22.0 (a dev version "
                                  "string such as 0.28.0.dev0+g... sorts before the release and TRL picks the wrong "
                                  "weight-sync API)",
                                  "use a release build, e.g. vllm/vllm-openai:v0.31.0"))
            elif v > high:
                out.append(Result("images", "vllm-version", WARN,
                                  f"vLLM {server_v} is newer than TRL 1.16's tested range (<= 0.31.0); the >= 0.28 API "
                                  "it imports exists there (verified on the CPU build)"))
            else:
                out.append(Result("images", "vllm-version", OK, f"trainer and server both vLLM {server_v}"))
    return out


@check("driver", "The NVIDIA driver on each GPU host runs the CUDA its images are built with (CUDA 13: R580+)")
def check_driver(ctx: Context) -> list[Result]:
    res, out = ctx.res, []
    client = ctx.docker()  # local images are what `up` ships to hosts that lack them
    for host in res.spec.hosts:
        if res.profiles[host.name].accelerator != "cuda":
            out.append(Result("driver", host.name, SKIP, f"profile {res.profiles[host.name].name} has no GPU"))
            continue
        found = _facts_of(ctx, host) if host.address != "local" else {}
        if isinstance(found, HostError):
            continue
        drivers = found["driver"] if host.address != "local" else host_facts.nvidia_driver(ctx.connector(host))
        for role, tag in [(r, t) for h, r, t in _images_needed(res) if h.name == host.name]:
            labels = ((found.get("images") or {}).get(role) or {}).get("labels") if found else None
            if labels is None and client is not None:
                labels = facts.image_labels(client, tag)
            out.append(driver_verdict(host.name, drivers, _image_cuda(tag, labels), tag, _compat_env(res)))
    return out


def _image_cuda(tag: str, labels: dict[str, str] | None) -> tuple[str | None, str]:
    """(CUDA major.minor of the image, where that came from): its label, else the kit's image table for its tag."""
    if labels and labels.get(CUDA_LABEL):
        return labels[CUDA_LABEL], "its label"
    for image in image_tags.GPU_IMAGES.values():
        if tag in {image_tags.arch_tag(image.name, a) for a in image.arches} | {image_tags.manifest_tag(image.name)}:
            return image.cuda, "the kit's image table (image not built here yet)"
    return None, f"no {CUDA_LABEL} label"


def _compat_env(res: Resolved) -> bool:
    env = getattr(getattr(res.settings, "vllm", None), "env", None) or {}
    return str(env.get(COMPAT_ENV, "")).strip() == "1"


def driver_verdict(host: str, drivers: list[host_facts.Driver] | None, cuda: tuple[str | None, str], tag: str,
                   compat_env: bool = False) -> Result:
    """The driver check's verdict for one image on one host, from nvidia-smi's answer and the image's CUDA."""
    version, source = cuda
    if not drivers:
        return Result("driver", host, FAIL, "nvidia-smi does not answer: no NVIDIA driver is loaded",
                      "install the NVIDIA driver (R580 or newer for CUDA 13 images) and the container toolkit")
    if version is None:
        return Result("driver", host, WARN, f"{tag}: CUDA unknown ({source}); driver {drivers[0].version}",
                      "rebuild the image with the kit's Dockerfiles (they set the label)")
    major = int(version.split(".")[0])
    need = MIN_DRIVER.get(major)
    have = min((d.major for d in drivers if d.major is not None), default=None)
    data = {"driver": drivers[0].version, "cuda": version, "min_driver": need}
    if need is None or have is None:
        return Result("driver", host, WARN, f"{tag}: CUDA {version}, driver {drivers[0].version}: no known minimum",
                      "check NVIDIA's CUDA compatibility table", data)
    fact = f"driver {drivers[0].version} (R{have}); {tag} is CUDA {version} (from {source}), which needs R{need}+"
    if have >= need:
        return Result("driver", host, OK, fact, data=data)
    datacenter = all(set(re.split(r"[^A-Z0-9]+", d.gpu.upper())) & set(DATACENTER_GPUS) for d in drivers)
    if datacenter and compat_env:
        return Result("driver", host, WARN, f"{fact}; {COMPAT_ENV}=1 is set: vLLM uses the image's CUDA forward "
                      "compatibility libraries", "upgrade the driver to R580+ when you can", data)
    if datacenter:
        return Result("driver", host, FAIL, f"{fact}: CUDA fails to initialise at start",
                      f"upgrade the NVIDIA driver to R{need} or newer, or (datacenter GPU: {drivers[0].gpu}) "
                      f"set {COMPAT_ENV}=1 where vLLM runs (trl-async: overrides: "
                      f"{{vllm: {{env: {{{COMPAT_ENV}: '1'}}}}}})",
                      data)
    return Result("driver", host, FAIL, f"{fact}: CUDA fails to initialise at start",
                  f"upgrade the NVIDIA driver to R{need} or newer ({drivers[0].gpu} has no CUDA forward compatibility)",
                  data)


def _in_container(ctx: Context, host, image: str, ident, argv: list[str]):
    """Run argv in a throw-away container of *image* on *host*, as *ident*, with the shared storage mounted."""
    return oneoff.run(ctx.connector(host), image, argv, ident=ident, share=(ctx.res, host))


@check("shared-volume", "The trainer's adapter files, written as the trainer identity on the trainer host, are read "
                        "as the server identity on the server host through the real shared storage")
def check_shared_volume(ctx: Context) -> list[Result]:
    """Writes a real safetensors probe the way the trainer saves adapters, then reads it as the server would."""
    res = ctx.res
    if not res.engine_info.server_role:
        return [Result("shared-volume", "-", SKIP, f"{res.engine} runs trainer and rollout in one process")]
    t_host, s_host = res.host_for("trainer"), res.host_for("server")
    where = t_host.name if t_host.name == s_host.name else f"{t_host.name}->{s_host.name}"
    for host, role in ((t_host, "trainer"), (s_host, "server")):
        image = res.image_for(role)
        present = _image_on(ctx, host, image)
        if present is not True:
            return [Result("shared-volume", where, SKIP, present or f"image {image} is not on {host.name} "
                           "yet: `up` ships it and probes then")]
    trainer, server = res.identities["trainer"], res.identities["server"]
    probe_dir = f"{res.run_dir}/.preflight-probe"
    mount = res.spec.storage.mount
    w = _in_container(ctx, t_host, res.image_for("trainer"), trainer,
                      ["python3", "-m", "grpo_deploy.runtime.probe", "write", "--dir", probe_dir])
    if oneoff.engine_error(w) is not None:
        return [_cannot_start(res, where, t_host.name, oneoff.engine_error(w))]
    if not w.ok:
        return [Result("shared-volume", where, FAIL,
                       f"the trainer identity UID {trainer.uid}:{trainer.gid} (umask {trainer.umask}) cannot write "
                       f"{probe_dir} on {t_host.name}: {w.line()}",
                       f"make {t_host.shared_dir or mount} writable by UID {trainer.uid} (directory owner, NFS export "
                       "owner)")]
    written = _last_json(w.out)
    # The reader also removes the probe when it can (same identity: the usual case), saving a container start;
    # otherwise the writer's identity cleans up.
    r = _in_container(ctx, s_host, res.image_for("server"), server,
                      ["sh", "-c", 'python3 -m grpo_deploy.runtime.probe read --dir "$0"; rc=$?; '
                       'rm -rf "$0" 2>/dev/null; exit $rc', probe_dir])
    read = _last_json(r.out)
    if (trainer.uid, trainer.gid) != (server.uid, server.gid) or not r.ok:
        _in_container(ctx, t_host, res.image_for("trainer"), trainer, ["rm", "-rf", probe_dir])
    if oneoff.engine_error(r) is not None:
        return [_cannot_start(res, where, s_host.name, oneoff.engine_error(r))]
    path = written.get("path", probe_dir)
    data = {"written": written, "read": read}
    if not r.ok or not read.get("ok", False):
        errors = "; ".join(f"{e.get('path')}: {e.get('error')}" for e in read.get("errors", [])) or r.line()
        missing = "No such file" in errors or "not found" in errors.lower()
        cause = (f"the server host {s_host.name} does not see the file the trainer host {t_host.name} wrote: the "
                 "two shared directories are not the same storage" if missing and t_host.name != s_host.name else
                 f"the server (UID {server.uid}:{server.gid}) cannot read the adapter probe {path} written by the "
                 f"trainer (UID {trainer.uid}:{trainer.gid}, umask {trainer.umask}, file mode "
                 f"{written.get('file_mode')}, dir mode {written.get('dir_mode')})")
        return [Result(
            "shared-volume", where, FAIL,
            f"{cause}: {errors}. vLLM would answer 404 and TRL would misreport it as 'does not expose "
            "/v1/load_lora_adapter'",
            "mount the same share on both hosts (hosts[].shared_dir or storage.nfs)" if missing else
            "run both roles as the same UID/GID (remove run.roles overrides) with umask 0022", data)]
    return [Result("shared-volume", where, OK,
                   f"probe {path} written on {t_host.name} as {trainer.uid}:{trainer.gid} (file "
                   f"{written.get('file_mode')}) and read on {s_host.name} as {server.uid}:{server.gid}", data=data)]


def _cannot_start(res: Resolved, where: str, host_name: str, error: str) -> Result:
    """The probe's container never started: the engine's own error, and the fix for the cause it names."""
    return Result("shared-volume", where, FAIL, f"a container with the share mounted cannot start on {host_name}: "
                  f"{error}", oneoff.start_failure_fix(res, host_name, error))


def _images_needed(res: Resolved) -> list[tuple[Any, str, str]]:
    """(host, image key, tag) for every image every host runs."""
    return [(host, key, res.images[key]) for host in res.spec.hosts for key in _image_roles(res, host)]


def _image_on(ctx: Context, host, tag: str) -> bool | str:
    """True when *tag* is on *host*'s engine; else why not (a message)."""
    if host.address != "local":
        found = _facts_of(ctx, host)
        if isinstance(found, HostError):
            return f"{host.name} unreachable (see the reachable check)"
        return host_facts.image(ctx.connector(host), tag) is not None
    client = ctx.docker()
    if client is None:
        return "Docker engine unreachable (see the docker check)"
    return facts.image_labels(client, tag) is not None


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def run_checks(ctx: Context, only: list[str] | None = None) -> list[Result]:
    results: list[Result] = []
    for name, _, fn in CHECKS:
        if only and name not in only:
            continue
        try:
            results.extend(fn(ctx))
        except Exception as exc:  # a check that cannot run is reported, never a traceback
            results.append(Result(name, "-", FAIL, f"check could not run: {type(exc).__name__}: {exc}"))
    return results


def table_text(results: list[Result]) -> str:
    return table(["check", "host", "verdict", "fact / fix"],
                 [[r.check, r.host, r.verdict.upper(), r.fact + (f"  -> fix: {r.hint}" if r.hint else "")]
                  for r in results])


def exit_code(results: list[Result]) -> int:
    return EXIT_FAILED if any(r.verdict == FAIL for r in results) else EXIT_OK


def to_json(results: list[Result]) -> str:
    code = exit_code(results)
    return json.dumps({"ok": code == EXIT_OK, "exit_code": code,
                       "checks": [asdict(r) for r in results]}, indent=2, default=str)
