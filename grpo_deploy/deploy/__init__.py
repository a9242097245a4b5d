"""The one entry to a run on its hosts — up, down, logs, status facts, events — for any spec, local, remote or
mixed: one path through the hosts' connectors (grpo_deploy.deploy.lifecycle brings a run up and down,
grpo_deploy.deploy.run_view reads it). The CLI calls these and never branches on where hosts are."""

from __future__ import annotations

import sys

from grpo_deploy.deploy import lifecycle as deploy
from grpo_deploy.deploy import run_view
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.hosts.connect import HostError, SshOptions
from grpo_deploy.names import UP_RESTARTS
from grpo_deploy.spec.resolve import Resolved

__all__ = ["LaunchError", "up", "down", "logs", "status_facts", "events"]


def up(res: Resolved, ssh: SshOptions, keep: bool = False, fresh: bool = False, restarts: int = UP_RESTARTS,
       out=sys.stdout, scratch: bool = False) -> int:
    """Bring the run up on its hosts, follow it to the end, summarise, and (unless keep) stop it."""
    return deploy.up(res, ssh, keep=keep, fresh=fresh, out=out, restarts=restarts, scratch=scratch)


def down(res: Resolved, ssh: SshOptions, volumes: bool = False) -> None:
    """Stop the run's containers on every host (and remove the shared volume with *volumes*)."""
    deploy.down(res, ssh, volumes=volumes)


def logs(res: Resolved, ssh: SshOptions, roles: list[str], follow: bool = False, tail: int = 200,
         host: str | None = None, raw: bool = False) -> int:
    """The run's container logs from its hosts (only *host*'s, or those running one of *roles*, when given); without
    control characters or terminal escapes unless *raw*."""
    if roles and not set(roles) <= set(res.engine_info.roles):
        raise LaunchError(f"--role {roles[0]!r}: engine {res.engine} has the roles {', '.join(res.engine_info.roles)}")
    dep = Deployment(res, ssh)
    try:
        return run_view.logs(dep, roles, follow=follow, tail=tail, host=host, raw=raw)
    except HostError as exc:
        raise LaunchError(str(exc)) from None
    finally:
        dep.close()


def status_facts(res: Resolved, ssh: SshOptions) -> tuple[list[dict], list[dict], dict | None]:
    """(container rows per host and role, the run's events, checkpoint headroom) for `status`."""
    return run_view.status_facts(res, ssh)


def events(res: Resolved, ssh: SshOptions) -> list[dict]:
    """The run's events (the deployer's and the trainer's, live from the hosts), limited to the latest `up`."""
    return run_view.events(res, ssh)
