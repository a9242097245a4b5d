"""The verl engine's bring-up: on one host the head container (grpo_deploy.runtime.verl.node: the Ray head, then
verl's trainer as a driver joining it); across hosts, in order, the head, its Ray answering, the workers on every
other host, the head's count of the cluster against the spec (exactly nnodes nodes, their GPUs and CPUs: verl starts
only then), progress per verl step from the kit's events until the head exits, and the restarts supervision asks for
(a killed head or a lost worker: the cluster formed again, verl resumes from its newest complete global_step_N,
resume_mode=auto as rendered)."""

from __future__ import annotations

import time
from collections.abc import Callable

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.deploy.bringup.base import POLL_S, STOPPED, container, follow_steps, main_exit
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.deploy.supervise import EnginePatience, RoleDied, exit_words
from grpo_deploy.engines.verl import VERL
from grpo_deploy.hosts.connect import HostError, on_all
from grpo_deploy.preflight import cluster as cluster_checks

ENGINE = VERL.name
"""The engine this bring-up serves (grpo_deploy.deploy.bringup.BRINGUP)."""
ROLE = "head"
WORKER = "worker"
HEAD_UP_TIMEOUT_S = 300.0  # the head's container start, its data, `ray start --head`
COUNT_GRACE_S = 20.0  # a worker lost: how long to wait for the head's count of the nodes before saying so
CLUSTER_TIMEOUT_S = 420.0  # beyond the head's own join timeout (300 s): its verdict always comes first


def hosts(dep: Deployment) -> list[str]:
    """The hosts this bring-up starts containers on: the head's, then every worker's."""
    return [dep.role_host(ROLE)] + _workers(dep)


def _workers(dep: Deployment) -> list[str]:
    return [h.name for h in dep.res.hosts_with(WORKER)]


def addresses(dep: Deployment) -> dict[str, str]:
    """Each node's address as preflight found it (what every node's Ray advertises); {} on one host."""
    return {name: a.ip for name, a in cluster_checks.node_addresses(dep.context).items()}


def addresses_words(ips: dict[str, str]) -> str:
    return f"Ray nodes at {', '.join(f'{h} {ip}' for h, ip in ips.items())}" if ips else "one Ray node (this host)"


def start(dep: Deployment, log: Callable[[str], None], ips: dict[str, str], since: float) -> None:
    """Start the head; across hosts then its Ray answering, the workers, and the head's verdict on the cluster."""
    host = dep.role_host(ROLE)
    if not _workers(dep):
        log(f"starting verl on {host} (Ray head, then verl's trainer joining it; rollout colocated); progress per "
            "step:")
        dep.project(host).up(ROLE)
        dep.state.emit("trainer_started")
        return
    form_cluster(dep, log, ips, since)


def form_cluster(dep: Deployment, log: Callable[[str], None], ips: dict[str, str], since: float) -> float:
    """Head, its Ray, the workers, the count: seconds from the head's start to the verdict. LaunchError (the
    numbers) when the cluster is not what the spec says; verl never started then."""
    host, workers = dep.role_host(ROLE), _workers(dep)
    at = f" ({ips[host]})" if host in ips else ""
    log(f"starting the Ray head on {host}{at}; verl's trainer joins it once every worker has")
    dep.project(host).up(ROLE)
    dep.state.emit("trainer_started")
    ready = wait_event(dep, since, "trainer_ready", HEAD_UP_TIMEOUT_S, "the Ray head to answer", watch_workers=False)
    head_s = ready["time"] - since
    log(f"Ray head up in {head_s:.1f} s; starting the workers on {', '.join(workers)}")
    for result in on_all([dep.hosts[w] for w in workers], lambda conn: dep.project(conn.name).up(WORKER)).values():
        if isinstance(result, HostError):
            raise result
    verdict = wait_event(dep, since, "ray_cluster", CLUSTER_TIMEOUT_S, "every worker to join", watch_workers=True)
    seconds = verdict["time"] - since
    dep.state.emit("cluster_formed", ok=bool(verdict.get("ok")), seconds=round(seconds, 2),
                   joined_s=round(verdict["time"] - ready["time"], 2), nodes=verdict.get("nodes"))
    if not verdict.get("ok"):
        raise LaunchError(f"the Ray cluster is not what the spec says, so verl was not started: {verdict['message']}")
    log(f"Ray cluster formed in {seconds:.1f} s: {verdict.get('nodes')} nodes, {verdict.get('gpus'):g} GPUs, "
        f"{verdict.get('cpus'):g} CPUs, as the spec says; verl's trainer starts; progress per step:")
    return seconds


def wait_event(dep: Deployment, since: float, name: str, timeout_s: float, what: str, watch_workers: bool) -> dict:
    """The head's first *name* event since *since*; LaunchError when the head (or, with *watch_workers*, a worker)
    exited first, or none came within *timeout_s*."""
    deadline = time.time() + timeout_s
    patience = EnginePatience(f"waiting for {what}")
    lost: tuple[str, str, float] | None = None
    while True:
        head, text = patience.poll(lambda: _read_head(dep), pause_s=POLL_S)
        found = [e for e in parse_events(text or "") if e["event"] == name and e["time"] >= since]
        if found:
            return found[0]
        if head["state"] in STOPPED:
            ends = [e for e in parse_events(text or "") if e["event"] == "run_end" and e["time"] >= since]
            said = ends[-1].get("error") if ends else None
            raise LaunchError(f"the Ray head exited on {dep.role_host(ROLE)} ({exit_words(int(head['exit_code']))}) "
                              f"while waiting for {what}: {said or dep.role_project(ROLE).tail(head['id'], 3)}")
        if watch_workers:
            lost = lost or _lost_worker(dep)
            joined = [e for e in parse_events(text or "") if e["event"] == "ray_nodes" and e["time"] >= since]
            if lost and (joined or time.time() > lost[2] + COUNT_GRACE_S):  # the head's count, when it has one
                count = f"; Ray saw {joined[-1]['nodes']} of {joined[-1]['want']} nodes" if joined else ""
                raise LaunchError(f"the Ray worker on {lost[0]} {lost[1]} before the cluster formed{count}: its "
                                  f"last lines: grpo-deploy logs --host {lost[0]}")
        if time.time() > deadline:
            raise LaunchError(f"no answer from the Ray head on {dep.role_host(ROLE)} within {timeout_s:.0f} s while "
                              f"waiting for {what}: grpo-deploy logs --role head")
        time.sleep(POLL_S)


def _lost_worker(dep: Deployment) -> tuple[str, str, float] | None:
    """(host, what happened, when seen) of a worker container that exited or is gone, None while all run."""
    for host, c in _worker_containers(dep).items():
        if c is None or c["state"] in STOPPED:
            return host, "is gone" if c is None else f"exited ({exit_words(int(c['exit_code']))})", time.time()
    return None


def _read_head(dep: Deployment) -> tuple[dict, str]:
    project = dep.role_project(ROLE)
    c = container(project, ROLE)
    return c, project.read(c["id"], f"{dep.res.run_dir}/metrics.jsonl") or ""


def _worker_containers(dep: Deployment) -> dict[str, dict | None]:
    """Each worker host's worker container (None when gone); a host whose engine does not answer is left out."""
    out = {}
    for host, found in on_all([dep.hosts[w] for w in _workers(dep)],
                              lambda conn: dep.project(conn.name).container(WORKER, strict=True)).items():
        if not isinstance(found, HostError):
            out[host] = found
    return out


def restart(dep: Deployment, log: Callable[[str], None], role: str) -> float:
    """Start again what a dead *role* needs: on one host the head; across hosts the whole cluster (workers stopped,
    the head started again, the workers joining it, the count checked again); verl resumes from its newest complete
    checkpoint."""
    head = dep.role_host(ROLE)
    if not _workers(dep):
        dep.project(head).up(ROLE)
        return 0.0
    again = time.time()
    log(f"forming the Ray cluster again (head on {head}, workers on {', '.join(_workers(dep))})")
    on_all([dep.hosts[w] for w in _workers(dep)], lambda conn: dep.project(conn.name).compose("rm", "-sf", WORKER))
    dep.project(head).compose("rm", "-sf", ROLE)
    return form_cluster(dep, log, {}, again)


def after_failure(dep: Deployment) -> None:
    """Nothing more to gather: the head's log (saved by `up`) holds verl's own error."""


def _snapshot(dep: Deployment, since: float) -> tuple[dict, str, dict]:
    """(the head's container, the run's events, {worker host: its container}: only while verl has not ended — the
    workers go once the head stops Ray at the end)."""
    c, text = _read_head(dep)
    ended = any(e["event"] == "run_end" and e["time"] >= since for e in parse_events(text))
    return c, text, _worker_containers(dep) if _workers(dep) and not ended else {}


def _judge(c: dict, workers: dict, step: int) -> int | None:
    """The head's exit code once it stopped; RoleDied for a killed head or a worker lost mid-run (restartable)."""
    for w in workers.values():
        if w is None or w["state"] in STOPPED:
            raise RoleDied(WORKER, 0 if w is None else int(w["exit_code"]), step)
    return main_exit(c, step)


def follow(dep: Deployment, log: Callable[[str], None], since: float) -> int:
    """Progress per verl step until the head exits (its exit code); RoleDied when it was killed or a worker was."""
    return follow_steps(dep, log, since, "verl", lambda: _snapshot(dep, since), _judge)
