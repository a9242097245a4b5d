"""Preflight: named checks, each reading a fact and giving a verdict and a fix hint; table/JSON output; exit codes.

A check is a small function `(Context) -> list[Result]`. Checks never change a host: the one that needs to
write (the shared-volume permission probe) writes only a probe file under the run's own directory and
removes it. Exit codes: 0 every check passed (warnings allowed), 1 a check failed, 2 preflight could not run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from . import compose, facts
from .plan import Plan, make_plan
from .resolve import Resolved
from .table import table

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2
TRL_VLLM_GATE = ((0, 22, 0), (0, 31, 0))  # trl 1.16.0: vllm>=0.22.0,<=0.31.0


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
    _docker_error: str | None = None
    _plan: Plan | None = None

    def docker(self):
        """The local engine's client, or None (the reason is kept in docker_error)."""
        if self.client is None and self._docker_error is None:
            try:
                self.client = facts.docker_client()
            except facts.DockerUnavailable as exc:
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
    """(free bytes, filesystem measured, how it was measured) for the checkpoint directory."""
    res = ctx.res
    host = _storage_host(res)
    if host.name in ctx.free_space:
        return ctx.free_space[host.name], f"{host.name}:{res.checkpoint_dir}", "given with --free-space"
    if host.address != "local":
        return None, f"{host.name}:{res.checkpoint_dir}", "remote host: measured when the deployer reaches it"
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


@check("docker", "The Docker engine answers on every host that runs containers")
def check_docker(ctx: Context) -> list[Result]:
    out = []
    for host in ctx.res.spec.hosts:
        if host.address != "local":
            out.append(Result("docker", host.name, SKIP, "remote host: checked by the multi-host deployer"))
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
            out.append(Result("arch", host.name, SKIP, "remote host: checked by the multi-host deployer"))
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


@check("port", "The vLLM server's published port is free on this host")
def check_port(ctx: Context) -> list[Result]:
    import socket

    res = ctx.res
    server = res.host_for("server")
    if server is None or server.address != "local":
        return [Result("port", "-", SKIP, "no local server host")]
    port = res.settings.vllm.port
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
                       "The trainer would load the model first and crash minutes later, after the GPUs were already paid for",
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
    if not any(h.address == "local" for h in res.spec.hosts):
        return [Result("images", "-", SKIP, "no local host: checked by the multi-host deployer")]
    client = ctx.docker()
    if client is None:
        return [Result("images", "local", SKIP, "Docker engine unreachable (see the docker check)")]
    out, versions = [], {}
    for role, tag in res.images.items():
        labels = facts.image_labels(client, tag)
        if labels is None:
            verdict = WARN if res.spec.images.build else FAIL
            out.append(Result("images", role, verdict, f"{tag} is not on the local engine",
                              "`grpo-deploy up` builds it (images.build: true), or `make images`"
                              if res.spec.images.build else "build or load it, or set images.build: true"))
            continue
        uid, gid = labels.get("org.grpo-deploy.uid"), labels.get("org.grpo-deploy.gid")
        ident = res.identities.get(role) or res.identities["head"]
        versions[role] = labels.get("org.grpo-deploy.vllm-version", "?")
        if uid is not None and (int(uid), int(gid or -1)) != (ident.uid, ident.gid):
            out.append(Result("images", role, FAIL,
                              f"{tag} was built for UID {uid}:{gid}, the run uses {ident.uid}:{ident.gid}: the "
                              "container user would have no passwd entry or HOME (PyTorch's getpass crashes)",
                              f"rebuild with --uid {ident.uid} --gid {ident.gid} or set run.uid/run.gid to the "
                              "image's"))
        else:
            out.append(Result("images", role, OK, f"{tag}: user {uid}:{gid}, vLLM {versions[role]}"))
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
                                  "string such as 0.28.0.dev0+g... sorts before the release and TRL picks the wrong weight-sync API)",
                                  "use a release build, e.g. vllm/vllm-openai:v0.31.0"))
            elif v > high:
                out.append(Result("images", "vllm-version", WARN,
                                  f"vLLM {server_v} is newer than TRL 1.16's tested range (<= 0.31.0); the >= 0.28 API "
                                  "it imports exists there (verified on the CPU build)"))
            else:
                out.append(Result("images", "vllm-version", OK, f"trainer and server both vLLM {server_v}"))
    return out


@check("shared-volume", "The trainer's adapter files, written as the trainer identity, read as the server identity")
def check_shared_volume(ctx: Context) -> list[Result]:
    """Writes a real safetensors probe the way the trainer saves adapters, then reads it as the server would."""
    res = ctx.res
    if not res.engine_info.server_role:
        return [Result("shared-volume", "-", SKIP, f"{res.engine} runs trainer and rollout in one process")]
    if not all(h.address == "local" for h in res.spec.hosts):
        return [Result("shared-volume", "-", SKIP, "remote hosts: probed by the multi-host deployer")]
    client = ctx.docker()
    if client is None:
        return [Result("shared-volume", "local", SKIP, "Docker engine unreachable (see the docker check)")]
    missing = [t for t in (res.images["trainer"], res.images["server"]) if facts.image_labels(client, t) is None]
    if missing:
        return [Result("shared-volume", "local", SKIP,
                       f"image {missing[0]} not built yet: probed by `up` after the build")]
    trainer, server = res.identities["trainer"], res.identities["server"]
    probe_dir = f"{res.run_dir}/.preflight-probe"
    volume, mount = res.spec.storage.volume, res.spec.storage.mount
    code, out, err = compose.run_once(
        client, res.images["trainer"], ["python", "-m", "grpo_deploy.runtime.probe", "write", "--dir", probe_dir],
        trainer.user, volume, mount, {"GRPO_UMASK": trainer.umask})
    if code != 0:
        return [Result("shared-volume", "local", FAIL,
                       f"the trainer identity UID {trainer.uid}:{trainer.gid} (umask {trainer.umask}) cannot write "
                       f"{probe_dir} on volume {volume}: {(err or out).strip().splitlines()[-1:] or ['?']}",
                       f"make {mount} writable by UID {trainer.uid} (image /shared owner, NFS export owner)")]
    written = _last_json(out)
    # The reader also removes the probe when it can (same identity: the usual case), saving a container start;
    # otherwise the writer's identity cleans up.
    code, out, err = compose.run_once(
        client, res.images["server"],
        ["sh", "-c", 'python -m grpo_deploy.runtime.probe read --dir "$0"; rc=$?; rm -rf "$0" 2>/dev/null; exit $rc',
         probe_dir], server.user, volume, mount, {"GRPO_UMASK": server.umask})
    read = _last_json(out)
    if (trainer.uid, trainer.gid) != (server.uid, server.gid):
        compose.run_once(client, res.images["trainer"], ["rm", "-rf", probe_dir], trainer.user, volume, mount)
    path = written.get("path", probe_dir)
    data = {"written": written, "read": read}
    if code != 0 or not read.get("ok", False):
        errors = "; ".join(f"{e.get('path')}: {e.get('error')}" for e in read.get("errors", [])) or (err or out).strip()
        return [Result(
            "shared-volume", "local", FAIL,
            f"the server (UID {server.uid}:{server.gid}) cannot read the adapter probe {path} written by the trainer "
            f"(UID {trainer.uid}:{trainer.gid}, umask {trainer.umask}, file mode {written.get('file_mode')}, dir mode "
            f"{written.get('dir_mode')}): {errors}. vLLM would answer 404 and TRL would misreport it as 'does not "
            "expose /v1/load_lora_adapter'",
            "run both roles as the same UID/GID (remove run.roles overrides) with umask 0022", data)]
    return [Result("shared-volume", "local", OK,
                   f"probe {path} written as {trainer.uid}:{trainer.gid} (file {written.get('file_mode')}) and read "
                   f"as {server.uid}:{server.gid}", data=data)]


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
