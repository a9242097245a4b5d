"""Read-only views of a run on its hosts, through the deployment's connectors: the trainer's metrics and the run's
events, container states per host and role, checkpoint headroom, container logs (printed without control characters
or terminal escapes unless asked for raw). Nothing here changes a host."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from grpo_deploy import preflight
from grpo_deploy.common.metrics import parse_events, read_events
from grpo_deploy.common.shown import printable
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.deploy.supervise import state_words
from grpo_deploy.hosts.connect import HostError, SshOptions, on_all
from grpo_deploy.spec.resolve import Resolved

STATUS_QUERY_S = 10  # status: the longest one query on a host may take (a busy engine costs seconds, not minutes)


def fetch_metrics(dep: Deployment) -> str | None:
    """The run's metrics.jsonl, read from the main role's container (running or stopped)."""
    main = dep.res.engine_info.main_role
    project = dep.role_project(main)
    c = project.container(main)
    return project.read(c["id"], f"{dep.res.run_dir}/metrics.jsonl") if c else None


def run_events(dep: Deployment, live: bool = False) -> list[dict]:
    """The deployer's events plus the trainer's (from its container when *live*, else the copy saved at the end),
    limited to the latest `up`: the metrics file appends across resumes."""
    text = None
    if live:
        try:
            text = fetch_metrics(dep)
        except HostError:
            text = None
    if text is not None:
        trainer = parse_events(text)
    elif dep.state.metrics_copy.exists():
        trainer = read_events(str(dep.state.metrics_copy))
    else:
        trainer = []
    events = dep.state.deploy_events() + trainer
    starts = [e for e in events if e["event"] == "up_start"]
    return [e for e in events if e["time"] >= starts[-1]["time"]] if starts else events


def host_states(dep: Deployment) -> list[dict]:
    """Per host and container: its role, its compose service (a vLLM replica's own name: server-2, ...), state and
    health (for status); a host whose engine did not answer is a row saying so."""
    rows = []
    for name, result in on_all(list(dep.hosts.values()), lambda h: dep.project(h.name).containers(strict=True)).items():
        if isinstance(result, HostError):
            rows.append({"host": name, "role": "-", "state": "unreachable", "health": str(result)})
            continue
        ordered = sorted(result, key=lambda c: (c["role"] or "", c.get("service") or ""))
        for c in ordered or [{"role": "-", "state": "no containers", "health": None}]:
            state = state_words(c["state"], c.get("exit_code")) if c["role"] != "-" else c["state"]
            rows.append({"host": name, "role": c["role"], "service": c.get("service") or c["role"], "state": state,
                         "health": c["health"]})
    return rows


def status_facts(res: Resolved, ssh: SshOptions) -> tuple[list[dict], list[dict], dict | None]:
    """What `status` shows of a run on its hosts — container states, the run's events, checkpoint headroom —
    gathered at once, every query bounded by STATUS_QUERY_S."""
    options = replace(ssh, command_cap_s=STATUS_QUERY_S)
    dep = Deployment(res, options)
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            states = pool.submit(host_states, dep)
            events = pool.submit(run_events, dep, True)
            disk = pool.submit(preflight.checkpoint_headroom, dep.context)
            return states.result(), events.result(), disk.result()
    finally:
        dep.close()


def events(res: Resolved, ssh: SshOptions) -> list[dict]:
    dep = Deployment(res, ssh)
    try:
        return run_events(dep, live=True)
    finally:
        dep.close()


def log_text(text: str, raw: bool = False) -> str:
    """Container output as `logs` prints it: through printable (no control character but newline and tab, no terminal
    escape: a container runs a model and third-party code), or as it came with *raw* (`logs --raw`)."""
    return text if raw else printable(text)


def logs(dep: Deployment, roles: list[str], follow: bool = False, tail: int = 200, host: str | None = None,
         raw: bool = False) -> int:
    """The run's container logs from its hosts (those running one of *roles*, or all); with *follow*, new lines from
    every host at once, each prefixed with its host, until the containers stop or Ctrl-C. Each line through log_text
    (*raw*: as the containers wrote it)."""
    if host is not None and host not in dep.hosts:
        raise LaunchError(f"--host {host!r}: the spec's hosts are {', '.join(dep.hosts)}")
    roles_of = {h.name: set(h.roles) for h in dep.res.spec.hosts}
    names = [n for n in ([host] if host else dep.hosts) if not roles or set(roles) & roles_of[n]]
    missing = [n for n in names if not dep.project(n).has_render()]
    if missing and len(missing) == len(names):
        raise LaunchError(f"no run {dep.res.spec.run.name} was started on {', '.join(missing)} from here "
                          f"({dep.project(missing[0]).env_file} is missing): grpo-deploy up starts it")
    if not follow:
        for name in names:
            print(f"===== host {name}")
            print(log_text(dep.project(name).logs(tail=tail, roles=roles), raw), flush=True)
        return 0
    printing = threading.Lock()

    def follow_one(name: str) -> None:
        project = dep.project(name)
        argv = project.compose_argv(*project.logs_args(project.services_of(roles), tail, follow=True))
        for line in dep.hosts[name].lines(argv):
            with printing:
                print(f"{name} | {log_text(line, raw)}", flush=True)

    threads = [threading.Thread(target=follow_one, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        dep.close()  # ends the remote `docker compose logs --follow`
    return 0
