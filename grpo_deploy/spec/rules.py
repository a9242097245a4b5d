"""The cross-field rules of a valid spec that do not need the profiles' values (those are checked when resolving):
hosts, the machines they name, publish, engine roles, checkpoints, logger and the shared volume."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

from grpo_deploy.common.shown import shown
from grpo_deploy.common.values import abs_path, parse_address
from grpo_deploy.engines import ENGINES
from grpo_deploy.settings import PATH_KEYS
from grpo_deploy.spec import profiles
from grpo_deploy.spec.schema import DeploymentSpec, HostSpec, LoadedSpec, Problem, key_str

Found = Iterator[tuple[tuple[Any, ...], str]]
"""What a rule yields: (the key's path, the message)."""

THIS_MACHINE = ("<this machine>", 0)
"""The machine of a host with address 'local', and of one whose SSH address is loopback on port 22."""


def _machine(address: str) -> tuple[str, int]:
    """The machine a host address names, as (host, SSH port): the user does not make another machine."""
    if address == "local":
        return THIS_MACHINE
    target = parse_address(address)
    host, port = target.host.lower().rstrip("."), target.port or 22
    literal = host if host != "localhost" else "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(literal).is_loopback
    except ValueError:
        loopback = False
    return THIS_MACHINE if loopback and port == 22 else (host, port)


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")



def check_consistency(loaded: LoadedSpec) -> list[Problem]:
    """Cross-field rules that do not need the profiles' values (those are checked when resolving)."""
    spec = loaded.spec
    engine = ENGINES[spec.engine]
    found = [*_host_rules(spec, engine), *_machine_rules(spec), *_engine_role_rules(spec, engine),
             *_checkpoint_rules(spec), *_logger_rules(spec, engine), *_shared_volume_rules(spec),
             *_model_rules(spec), *_pass_through_path_rules(spec)]
    return [Problem(loaded.doc.where(path), key_str(path), message) for path, message in found]


def _host_rules(spec: DeploymentSpec, engine) -> Found:
    """Each host entry: a unique name, a known profile for this engine, its roles, mount, replicas, GPUs, publish."""
    names_seen: set[str] = set()
    for i, host in enumerate(spec.hosts):
        if host.name in names_seen:
            yield ("hosts", i, "name"), f"duplicate host name {host.name!r}"
        names_seen.add(host.name)
        try:
            profile = profiles.load(host.profile)
        except profiles.ProfileError as exc:
            yield ("hosts", i, "profile"), str(exc)
            continue
        mismatch = profiles.engine_mismatch(profile, spec.engine)
        if mismatch:
            yield ("hosts", i, "profile"), mismatch
        for j, role in enumerate(host.roles):
            if role not in engine.roles:
                yield (("hosts", i, "roles", j),
                       f"role {role!r} is not a {spec.engine} role; allowed: {', '.join(engine.roles)}")
            elif role in host.roles[:j]:
                yield ("hosts", i, "roles", j), f"role {role!r} is listed twice"
        both = [role for role in engine.exclusive_roles if role in host.roles]
        if len(both) > 1:
            yield (("hosts", i, "roles"), f"host {host.name} is given roles {' and '.join(both)}, which one host does "
                   f"not run together on engine {spec.engine} (each is one Ray node of its host): keep one of them")
        if host.mount is not None and host.mount != spec.storage.mount:
            yield (
                ("hosts", i, "mount"),
                f"the shared volume is mounted at {shown(host.mount)} here but at {shown(spec.storage.mount)} "
                f"(storage.mount) elsewhere: the adapter path the trainer sends must resolve to the same "
                f"absolute path in every container. Remove hosts[{i}].mount or make them equal",
            )
        if host.replicas is not None and engine.replica_role not in host.roles:
            yield (("hosts", i, "replicas"), f"replicas count {engine.replica_role or 'server'} replicas and host "
                   f"{host.name} runs no {engine.replica_role or 'server'} role"
                   f"{'' if engine.replica_role else f' (engine {spec.engine} has none)'}: remove hosts[{i}].replicas")
        for role in host.gpus or {}:
            if role not in host.roles:
                yield ("hosts", i, "gpus", role), f"GPUs given for role {role!r} which this host does not run"
        if host.gpus and profile.accelerator != "cuda":
            yield (("hosts", i, "gpus"), f"profile {profile.name} has no GPUs (accelerator {profile.accelerator}): "
                   f"the kit reserves none and the GPUs listed would be ignored; remove hosts[{i}].gpus or use a GPU "
                   "profile")
        if host.publish is not None:
            yield from _publish_rules(spec, engine, i, host)


def _publish_rules(spec: DeploymentSpec, engine, i: int, host: HostSpec) -> Found:
    """hosts[].publish: only a host whose server the main role reaches over the network publishes anywhere."""
    served, main = engine.published_role, engine.main_role
    if served not in host.roles:
        yield (("hosts", i, "publish"), f"host {host.name} runs no {served or 'server'} role, so nothing of it is "
               f"published{'' if served else f' (engine {spec.engine} publishes no port)'}: remove "
               f"hosts[{i}].publish")
    elif main in host.roles:
        yield (("hosts", i, "publish"), f"host {host.name} runs the {main} too: its {served} is reached over the "
               "compose network and published on loopback only, so publish would be ignored; remove "
               f"hosts[{i}].publish")
    elif ipaddress.ip_address(host.publish).is_loopback:
        yield (("hosts", i, "publish"), f"{host.publish} is loopback and the {main} runs on another host, which "
               f"cannot reach it there: remove hosts[{i}].publish (the {served} then publishes on the address the "
               f"{main} uses), or write this host's IP (0.0.0.0 for all interfaces)")


def _machine_rules(spec: DeploymentSpec) -> Found:
    """Two hosts of a spec are two machines: one 'local' at most, and no two addresses of the same machine."""
    if sum(host.address == "local" for host in spec.hosts) > 1:
        yield ("hosts",), "more than one host has address 'local'"
    machines: dict[tuple[str, int], int] = {}
    for i, host in enumerate(spec.hosts):
        machine = _machine(host.address)
        first = machines.setdefault(machine, i)
        if first == i or spec.hosts[first].name == host.name:  # (a duplicate name says enough)
            continue
        if machine == THIS_MACHINE:
            if host.address == spec.hosts[first].address == "local":
                continue  # (more than one 'local' is said above)
            at, other = (i, first) if host.address != "local" else (first, i)
            yield (("hosts", at, "address"), f"{shown(spec.hosts[at].address)} is this machine, and so is "
                   f"hosts[{other}] (address {shown(spec.hosts[other].address)}): two hosts of a spec are two machines "
                   "(each would claim the same GPUs, and a container's loopback is not the host's); put both roles on "
                   "one host entry instead")
        else:
            yield (("hosts", i, "address"), f"the same SSH host and port as hosts[{first}]: two hosts of a spec are "
                   "two machines (the server would publish on loopback while the trainer is told the remote name); "
                   "put both roles on one host entry instead")


def _engine_role_rules(spec: DeploymentSpec, engine) -> Found:
    """Roles against the engine: run.roles identities of roles that run, the engine's foreign keys, role counts."""
    running = {role for h in spec.hosts for role in h.roles}
    for role in spec.run.roles:
        if role not in running:
            yield (("run", "roles", role), f"no host of this spec runs role {role!r} (engine {spec.engine}, roles "
                   f"run: {', '.join(r for r in engine.roles if r in running)}): its identity would never be used; "
                   f"remove run.roles.{role}")
    yield from engine.foreign_keys(spec)
    for role, (least, most) in engine.role_counts.items():
        having = [i for i, h in enumerate(spec.hosts) if role in h.roles]
        if len(having) > most and engine.role_limit_why(role):
            yield ("hosts", having[most], "roles"), engine.role_limit_why(role)
        elif not least <= len(having) <= most:
            count = f"exactly {least}" if least == most else f"at least {least}" if len(having) < least else \
                f"at most {most}"
            yield ("hosts",), f"{spec.engine} needs {count} host(s) with role {role!r}, found {len(having)}"


def _checkpoint_rules(spec: DeploymentSpec) -> Found:
    """checkpoints.dir and checkpoints.resume on the shared volume."""
    ckpt = spec.checkpoints
    if ckpt.dir is not None and not (ckpt.dir == spec.storage.mount or ckpt.dir.startswith(spec.storage.mount + "/")):
        yield (
            ("checkpoints", "dir"),
            f"{shown(ckpt.dir)} is not under the shared volume {shown(spec.storage.mount)}: a resume on another host "
            "(or after a container restart) would not find it",
        )
    if ckpt.resume not in (None, "auto", "never") and not _under(ckpt.resume, spec.storage.mount):
        yield (
            ("checkpoints", "resume"),
            f"{shown(ckpt.resume)} is not under the shared volume {shown(spec.storage.mount)}: the containers see the "
            "share only there, and every checkpoint the kit writes is on it; give the checkpoint's path under "
            f"{shown(spec.storage.mount)}",
        )


def _logger_rules(spec: DeploymentSpec, engine) -> Found:
    """logger.project and logger.entity only where the logger kind reads them on this engine."""
    for key in ("project", "entity"):
        kinds = engine.logger_keys.get(key, ())
        if getattr(spec.logger, key) is not None and spec.logger.kind not in kinds:
            yield (("logger", key), f"logger.kind {spec.logger.kind} reads no {key} on engine {spec.engine} (read by: "
                   f"{', '.join(kinds) or 'none of its loggers'}), so it would be ignored: remove logger.{key}"
                   + (f", or set logger.kind to {' or '.join(kinds)}" if kinds else ""))


def _shared_volume_rules(spec: DeploymentSpec) -> Found:
    """Hosts on different machines share a volume: storage.nfs, or a shared_dir on every host."""
    if spec.storage.nfs is None and len({h.address for h in spec.hosts}) > 1:
        missing = [i for i, h in enumerate(spec.hosts) if not h.shared_dir]
        if missing:
            yield (
                ("storage", "nfs"),
                "hosts on different machines need a shared volume: set storage.nfs (server, export) "
                "or hosts[].shared_dir (where the share is already mounted on each host)",
            )


def _model_rules(spec: DeploymentSpec) -> Found:
    """One model: model.path (or served_name) and overrides.model.path (or served_name) may not name two."""
    given = spec.overrides.get("model", {})
    for key in ("path", "served_name"):
        ours, theirs = getattr(spec.model, key), given.get(key)
        if ours is not None and theirs is not None and theirs != ours:
            yield (("overrides", "model", key), f"names {shown(theirs)} and model.{key} names {shown(ours)}: two keys "
                   f"naming different models; keep model.{key} and remove overrides.model.{key}")


def _pass_through_path_rules(spec: DeploymentSpec) -> Found:
    """Passed-through keys that name a file (overrides.trl.deepspeed, ...): an absolute path on the shared volume,
    the one place every container sees."""
    for section, keys in PATH_KEYS.items():
        for key, value in spec.overrides.get(section, {}).items():
            if key.lstrip("+") not in keys or value is None:
                continue
            for path in value if isinstance(value, list) else [value]:
                if not isinstance(path, str):
                    continue  # (its type is the section's to refuse)
                try:
                    path = abs_path(path)
                except ValueError as exc:
                    yield ("overrides", section, key), f"{exc}; give a file on the shared volume {spec.storage.mount}"
                    break
                if not _under(path, spec.storage.mount):
                    yield (("overrides", section, key), f"{shown(path)} is not under the shared volume "
                           f"{shown(spec.storage.mount)}: the containers see the share only there; put the file on "
                           f"the share and give its path under {shown(spec.storage.mount)}")
                    break
