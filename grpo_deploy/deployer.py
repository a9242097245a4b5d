"""The one entry to a run on its hosts — up, down, logs, status facts, events — for any spec: the only place that
chooses between the deployer of this machine alone (grpo_deploy.launch, Docker SDK) and the one across host
connectors (grpo_deploy.deploy, SSH or this machine). The CLI calls these and never branches on where hosts are."""

from __future__ import annotations

import sys

from . import checks, deploy, launch
from .hosts.connect import HostError, SshOptions
from .names import UP_RESTARTS
from .resolve import Resolved

LaunchError = launch.LaunchError


def across_hosts(res: Resolved) -> bool:
    """Whether any host is reached over SSH (the connectors' deployer); else everything runs on this machine."""
    return any(h.address != "local" for h in res.spec.hosts)


def up(res: Resolved, ssh: SshOptions, keep: bool = False, fresh: bool = False, restarts: int = UP_RESTARTS,
       out=sys.stdout) -> int:
    """Bring the run up on its hosts, follow it to the end, summarise, and (unless keep) stop it."""
    if across_hosts(res):
        return deploy.up(res, ssh, keep=keep, fresh=fresh, out=out, restarts=restarts)
    return launch.up(res, keep=keep, fresh=fresh, out=out, restarts=restarts)


def down(res: Resolved, ssh: SshOptions, volumes: bool = False) -> None:
    """Stop the run's containers on every host (and remove the shared volume with *volumes*)."""
    if not across_hosts(res):
        launch.down(res, volumes=volumes)
        return
    dep = deploy.Deployment(res, ssh)
    try:
        deploy.down_all(dep, volumes=volumes)
    finally:
        dep.close()


def logs(res: Resolved, ssh: SshOptions, roles: list[str], follow: bool = False, tail: int = 200,
         host: str | None = None) -> int:
    """The run's container logs from its hosts (only *host*'s, or those running one of *roles*, when given)."""
    if roles and not set(roles) <= set(res.engine_info.roles):
        raise LaunchError(f"--role {roles[0]!r}: engine {res.engine} has the roles {', '.join(res.engine_info.roles)}")
    if not across_hosts(res):
        if host and host != "local":
            raise LaunchError(f"--host {host!r}: this run has one host, local")
        return launch.logs(res, roles, follow=follow, tail=tail)
    dep = deploy.Deployment(res, ssh)
    try:
        return deploy.logs(dep, roles, follow=follow, tail=tail, host=host)
    except HostError as exc:
        raise LaunchError(str(exc)) from None
    finally:
        dep.close()


def status_facts(res: Resolved, ssh: SshOptions) -> tuple[list[dict], list[dict], dict | None]:
    """(container rows per host and role, the run's events, checkpoint headroom) for `status`."""
    if across_hosts(res):
        return deploy.status_facts(res, ssh)
    events, hosts = launch.run_events(launch.RunState(res), live=True), launch.host_states(res)
    ctx = checks.Context(res, ssh=ssh)
    try:
        return hosts, events, checks.checkpoint_headroom(ctx)
    finally:
        ctx.close()


def events(res: Resolved, ssh: SshOptions) -> list[dict]:
    """The run's events (the deployer's and the trainer's, live from the hosts), limited to the latest `up`."""
    if not across_hosts(res):
        return launch.run_events(launch.RunState(res), live=True)
    dep = deploy.Deployment(res, ssh)
    try:
        return deploy.run_events(dep, live=True)
    finally:
        dep.close()
