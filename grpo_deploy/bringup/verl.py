"""The verl engine's bring-up on one host: the head container started (grpo_deploy.runtime.verl_node: the Ray head,
then verl's trainer as a driver joining it), progress per verl step from the kit's events until it exits, and the
restart supervision asks for (a killed head started again; verl resumes from its newest complete global_step_N,
resume_mode=auto as rendered)."""

from __future__ import annotations

from collections.abc import Callable

from ..deployment import Deployment
from . import container, follow_steps, main_exit

ROLE = "head"


def hosts(dep: Deployment) -> list[str]:
    """The hosts this bring-up starts containers on: the head's."""
    return [dep.role_host(ROLE)]


def start(dep: Deployment, log: Callable[[str], None], ips: dict[str, str], since: float) -> None:
    """Start the head: Ray, then verl's trainer in it; the first step is its readiness."""
    host = dep.role_host(ROLE)
    log(f"starting verl on {host} (Ray head, then verl's trainer joining it; rollout colocated); progress per step:")
    dep.project(host).up(ROLE)
    dep.state.emit("trainer_started")


def restart(dep: Deployment, log: Callable[[str], None], role: str) -> float:
    """Start the head again; verl resumes from its newest complete checkpoint."""
    dep.project(dep.role_host(ROLE)).up(ROLE)
    return 0.0


def after_failure(dep: Deployment) -> None:
    """Nothing more to gather: the head's log (saved by `up`) holds verl's own error."""


def _snapshot(dep: Deployment) -> tuple[dict, str, None]:
    project = dep.role_project(ROLE)
    c = container(project, ROLE)
    return c, project.read(c["id"], f"{dep.res.run_dir}/metrics.jsonl") or "", None


def follow(dep: Deployment, log: Callable[[str], None], since: float) -> int:
    """Progress per verl step until the head exits (its exit code); RoleDied when it was killed."""
    return follow_steps(dep, log, since, "verl", lambda: _snapshot(dep), lambda c, _rest, step: main_exit(c, step))
