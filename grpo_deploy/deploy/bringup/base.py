"""What the engines' bring-ups share: the role's container on its host, the main role's exit read from it, and the
progress per step followed until the run ends (grpo_deploy.deploy.bringup's modules build on them)."""

from __future__ import annotations

import time
from collections.abc import Callable

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.deploy.supervise import KILLED, EnginePatience, RoleDied
from grpo_deploy.hosts.project import RemoteProject

POLL_S = 2.0
STOPPED = ("exited", "dead")


def container(project: RemoteProject, role: str) -> dict:
    """The role's container on its host (running or stopped); LaunchError when it is gone, HostError when the
    host's engine did not answer (ridden out by EnginePatience)."""
    c = project.container(role, strict=True)
    if c is None:
        raise LaunchError(f"the {role} container is gone on {project.host.name}")
    return c


def main_exit(c: dict, last_step: int) -> int | None:
    """The main role's exit code once its container stopped, None while it runs; RoleDied when it was killed
    (SIGKILL: `docker kill`, the OOM killer, a reboot), which a restart recovers from."""
    if c["state"] not in STOPPED:
        return None
    if int(c["exit_code"]) == KILLED:
        raise RoleDied("trainer", KILLED, last_step)
    return int(c["exit_code"])


def follow_steps(dep: Deployment, log: Callable[[str], None], since: float, what: str,
                 read: Callable[[], tuple[dict, str, object]],
                 judge: Callable[[dict, object, int], int | None]) -> int:
    """Progress per step (the kit's `step` events since *since*) until *judge*(main container, the rest *read*
    gave, last step) says the run ended — its exit code — or raises RoleDied; the metrics text is saved either way.
    *read*() -> (the main role's container, its metrics text, anything else judge needs), retried while the engine
    is slow (EnginePatience)."""
    from grpo_deploy import status

    total = dep.res.engine_info.total_steps(dep.res)
    seen, last_step = 0, 0
    patience = EnginePatience(f"following {what}")
    while True:
        c, text, rest = patience.poll(read, pause_s=POLL_S)
        shown = [e for e in parse_events(text) if e["event"] in ("step", "watch") and e["time"] >= since]
        for e in shown[seen:]:  # a step's progress line, or what the run watcher found (one line each)
            if e["event"] == "watch":
                log(f"run watcher: {status.one_line(e.get('message'))}")
                continue
            log(status.progress_line(e, total, dep.res.engine_info.progress))
            last_step = status.step_of(e, last_step)
        seen = len(shown)
        try:
            code = judge(c, rest, last_step)
        except RoleDied:
            dep.state.metrics_copy.write_text(text)
            raise
        if code is not None:
            dep.state.metrics_copy.write_text(text)
            return code
        time.sleep(POLL_S)
