"""Ordered bring-up of a run across hosts, through their connectors (SSH or this machine): preflight (facts read in
parallel, nothing changed), the compose files and each host's render to every host, images shipped where missing,
the cross-host adapter probe, the server first, readiness checked from the trainer's host (model listed, one token
generated), the trainer, progress per step, a summary. All-or-nothing: a failure after start stops what this `up`
started on every host. Also status, logs and down across hosts."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from . import checks, status
from .hosts import facts as host_facts
from .hosts import oneoff
from .hosts.connect import Host, HostError, SshOptions, connect, on_all
from .hosts.project import RemoteProject
from .hosts.ship import Shipped, ship
from .launch import KILLED, LaunchError, RoleDied, RunState, build_images, finish, require_kit, state_words, supervise
from .names import READY_TIMEOUT_S, STATE_DIR, UP_RESTARTS
from .render import render_files
from .resolve import Resolved
from .runtime.metrics import parse_events
from .runtime.values import ip_literal, parse_address

POLL_S = 2.0
STATUS_QUERY_S = 10  # status: the longest one query on a host may take (a busy engine costs seconds, not minutes)


@dataclass
class Deployment:
    """The run's hosts with their connectors and compose projects."""

    res: Resolved
    ssh: SshOptions
    state: RunState = field(init=False)
    hosts: dict[str, Host] = field(default_factory=dict)
    projects: dict[str, RemoteProject] = field(default_factory=dict)

    def __post_init__(self):
        self.state = RunState(self.res)
        for host in self.res.spec.hosts:
            self.hosts[host.name] = connect(host, self.ssh)

    def project(self, name: str) -> RemoteProject:
        """The run's compose project on a host; its folder is ~/.grpo-deploy/<run> there (this machine: the run's
        state folder)."""
        if name not in self.projects:
            host = self.hosts[name]
            if host.is_local:
                root = str(self.state.dir / "hosts" / name)
            else:
                home = host_facts.home(host)
                if not home:
                    raise HostError(name, "cannot read the login user's home directory", "check the SSH login")
                root = f"{home}/{STATE_DIR}/{self.res.spec.run.name}"
            self.projects[name] = RemoteProject(host, root, self.res.spec.run.name)
        return self.projects[name]

    def role_host(self, role: str) -> str:
        return self.res.host_for(role).name

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()


def publish_ips(dep: Deployment) -> dict[str, str]:
    """The server host's IP as the trainer's host resolves its address (a name is looked up there)."""
    res = dep.res
    server, trainer = res.host_for("server"), res.host_for("trainer")
    if server is None or trainer is None or server.name == trainer.name or server.publish:
        return {}
    host = parse_address(server.address).host if server.address != "local" else None
    if host is None:
        return {}
    literal = ip_literal(host)
    if literal:
        return {server.name: literal}
    r = dep.hosts[trainer.name].run(["getent", "ahostsv4", host])
    ip = r.out.split()[0] if r.ok and r.out.split() else None
    if ip is None:
        raise HostError(trainer.name, f"cannot resolve the server's address {host!r} there",
                        "use an IP address in hosts[].address, or add the name to that host's /etc/hosts")
    return {server.name: ip}


def _ship_all(dep: Deployment, log: Callable[[str], None]) -> list[Shipped]:
    res = dep.res
    wanted = {name: sorted({res.images[r] for r in checks.image_roles(res, h)})
              for name, h in ((h.name, h) for h in res.spec.hosts) if not dep.hosts[name].is_local}
    last: dict[str, float] = {}

    def progress(key: str, line: str) -> None:
        if time.time() - last.get(key, 0) >= 10:
            last[key] = time.time()
            log(line)

    def to_host(host: Host) -> list[Shipped]:
        return [ship(tag, host, lambda line: progress(host.name, line)) for tag in wanted[host.name]]

    results = on_all([dep.hosts[n] for n in wanted], to_host)
    shipped: list[Shipped] = []
    for name, result in results.items():
        if isinstance(result, HostError):
            raise result
        for s in result:
            shipped.append(s)
            if s.status == "present":
                log(f"{name}: {s.tag} already there (same image ID): nothing sent")
            else:
                log(f"{name}: {s.tag} shipped, {s.bytes_sent / 1e6:,.1f} MB in {s.seconds:.1f} s "
                    f"({s.layers_sent} layer(s) sent, {s.layers_skipped} already there)")
    return shipped


def _put_render(dep: Deployment, ips: dict[str, str]) -> None:
    def put(host: Host) -> int:
        project = dep.project(host.name)
        return project.put(render_files(dep.res, config_dir=project.config_dir, publish_ips=ips))

    for result in on_all(list(dep.hosts.values()), put).values():
        if isinstance(result, HostError):
            raise result


def _container(project, role: str) -> dict:
    """The role's container on its host (running or stopped); LaunchError when it is gone."""
    c = project.container(role)
    if c is None:
        raise LaunchError(f"the {role} container is gone on {project.host.name}")
    return c


def _wait_server(dep: Deployment, log: Callable[[str], None], since: float) -> float:
    """Until the server container's health check passes (model listed); fail at once if it exits."""
    project = dep.project(dep.role_host("server"))
    last_note = 0.0
    while True:
        c = _container(project, "server")
        if c["state"] in ("exited", "dead"):
            raise LaunchError(f"the vLLM server exited on {project.host.name} before it was ready "
                              f"(exit {c['exit_code']}):\n{project.tail(c['id'])}")
        if c["health"] == "healthy":
            return time.time() - since
        elapsed = time.time() - since
        if elapsed > READY_TIMEOUT_S:
            raise LaunchError(f"the server was not ready after {READY_TIMEOUT_S} s (model not listed in /v1/models)")
        if elapsed - last_note >= 15:
            log(f"waiting for the server on {project.host.name}: {elapsed:4.0f} s")
            last_note = elapsed
        time.sleep(POLL_S)


def _check_from_trainer(dep: Deployment, ips: dict[str, str]) -> str:
    """From the trainer's host, in a container of the trainer image: the server lists the model and generates."""
    res = dep.res
    trainer = dep.role_host("trainer")
    url = res.server_url_for(ips)
    url_host = parse_address(url.split("//", 1)[1]).host
    r = oneoff.run(dep.hosts[trainer], res.image_for("trainer"),
                   ["python3", "-m", "grpo_deploy.runtime.health", "--role", "server", "--host", url_host,
                    "--port", str(res.settings.vllm.port), "--model", res.settings.model.served_name, "--complete"],
                   network="bridge", timeout=400)
    if not r.ok:
        raise LaunchError(f"the trainer's host {trainer} cannot use the server at {url}: {r.line()} "
                          "(a firewall, a wrong hosts[].publish, or the server's address resolving elsewhere there)")
    return r.out.strip().splitlines()[-1] if r.out.strip() else "ok"


def fetch_metrics(dep: Deployment) -> str | None:
    """The run's metrics.jsonl, read from the trainer's container (running or stopped)."""
    project = dep.project(dep.role_host(dep.res.engine_info.main_role))
    c = project.container(dep.res.engine_info.main_role)
    return project.read(c["id"], f"{dep.res.run_dir}/metrics.jsonl") if c else None


def _follow(dep: Deployment, log: Callable[[str], None], since: float) -> int:
    """Progress per step until the trainer exits (its exit code); RoleDied when the server's container exits while
    the trainer has not finished cleanly, or the trainer is killed."""
    res = dep.res
    project = dep.project(dep.role_host("trainer"))
    seen, last_step = 0, 0
    while True:
        c = _container(project, "trainer")
        text = project.read(c["id"], f"{res.run_dir}/metrics.jsonl") or ""
        steps = [e for e in parse_events(text) if e["event"] == "step" and e["time"] >= since]
        for e in steps[seen:]:
            log(status.progress_line(e, res.engine_info.total_steps(res)))
            last_step = int(e.get("step", last_step))
        seen = len(steps)
        server = dep.project(dep.role_host("server")).container("server")
        trainer_done = c["state"] in ("exited", "dead") and int(c["exit_code"]) == 0
        if (server is None or server["state"] in ("exited", "dead")) and not trainer_done:
            dep.state.metrics_copy.write_text(text)
            raise RoleDied("server", int(server["exit_code"]) if server else -1, last_step)
        if c["state"] in ("exited", "dead"):
            dep.state.metrics_copy.write_text(text)
            if int(c["exit_code"]) == KILLED:
                raise RoleDied("trainer", KILLED, last_step)
            return int(c["exit_code"])
        time.sleep(POLL_S)


def _save_logs(dep: Deployment) -> None:
    parts = []
    for name in dep.hosts:
        try:
            parts.append(f"===== host {name}\n{dep.project(name).logs(tail=2000)}")
        except HostError as exc:
            parts.append(f"===== host {name}: {exc}")
    (dep.state.dir / "logs.txt").write_text("\n".join(parts))


def down_all(dep: Deployment, volumes: bool = False) -> None:
    for result in on_all(list(dep.hosts.values()), lambda h: dep.project(h.name).down(volumes)).values():
        if isinstance(result, HostError):
            print(f"warning: {result}", file=sys.stderr)


def up(res: Resolved, ssh: SshOptions, keep: bool = False, fresh: bool = False, out=sys.stdout,
       restarts: int = UP_RESTARTS) -> int:
    """Bring the run up across its hosts, follow it to the end, summarise, and (unless keep) stop it."""
    res.engine_info.refuse("up", LaunchError)
    require_kit()
    with RunState(res).up_lock():
        return _up(res, ssh, keep, fresh, out, restarts)


def _up(res: Resolved, ssh: SshOptions, keep: bool, fresh: bool, out, restarts: int = UP_RESTARTS) -> int:
    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=out, flush=True)

    dep = Deployment(res, ssh)
    state = dep.state
    state.dir.mkdir(parents=True, exist_ok=True)
    if state.deploy_log.exists():
        state.deploy_log.unlink()
    state.emit("up_start", run=res.spec.run.name, engine=res.engine, hosts=list(dep.hosts))
    started: list[str] = []
    try:
        log(f"preflight on {', '.join(dep.hosts)} (facts only: nothing is changed)")
        ctx = checks.Context(res, ssh=ssh, connectors=dep.hosts)
        if _failed(checks.run_checks(ctx, only=checks.before_shipping()),
                   out, log, state):
            return checks.EXIT_FAILED
        client = ctx.docker()  # images are built (or refreshed) here, then shipped from here
        if client is None:
            raise LaunchError(f"no Docker engine answers on this machine: {ctx.docker_error}")
        state.emit("images_ready", build_s=round(build_images(client, res, log), 2))
        log("images to the hosts (only what is missing)")
        shipped = _ship_all(dep, log)
        state.emit("shipped", items=[s.__dict__ for s in shipped])
        ips = publish_ips(dep)
        _put_render(dep, ips)
        log(f"render and compose files on every host; the server publishes on {ips or 'loopback (same host)'}")
        ctx.forget_facts()  # the images are there now
        if _failed(checks.run_checks(ctx, only=checks.after_shipping()), out, log, state):
            return checks.EXIT_FAILED
        state.emit("preflight_done")  # the multi-host order: images, shipping, then this last preflight
        server_host, trainer_host = dep.role_host("server"), dep.role_host("trainer")
        if fresh:
            log(f"--fresh: removing {res.run_dir}")
            failed = oneoff.remove_run_dir(dep.hosts[dep.role_host(res.engine_info.main_role)], res)
            if failed:
                raise LaunchError(failed)
        start = time.time()
        started.append(server_host)
        dep.project(server_host).up("server")
        log(f"server starting on {server_host}")
        # The trainer starts as soon as the server's container runs: it builds its model while the server loads
        # (TRL waits for the server before its first request), as on one host. The server's readiness and the
        # cross-host check below stay the gate: if either fails, both are rolled back before any training.
        started.append(trainer_host)
        trainer_start = time.time()
        dep.project(trainer_host).up("trainer")
        state.emit("trainer_started")
        log(f"trainer starting on {trainer_host} (it builds its model while the server loads)")
        ready_s = _wait_server(dep, log, start)
        state.emit("server_ready", seconds=round(ready_s, 2))
        log(f"server ready in {ready_s:.1f} s; from {trainer_host}: {_check_from_trainer(dep, ips)}; progress per "
            "optimizer step:")

        def restart(role: str) -> float:
            if role == "trainer":
                dep.project(trainer_host).up("trainer")
                return 0.0
            dep.project(trainer_host).compose("stop", "trainer")
            restart_at = time.time()
            dep.project(server_host).up("server")
            dep.project(trainer_host).up("trainer")
            return _wait_server(dep, log, restart_at)

        code = supervise(state, log, trainer_start - 1, restarts, lambda since: _follow(dep, log, since), restart)
    except (LaunchError, HostError, KeyboardInterrupt) as exc:
        if started:
            log(f"rolling back: stopping what this up started on {', '.join(dict.fromkeys(started))}")
            _save_logs(dep)
            down_all(dep)
        state.emit("up_end", status="failed", error=str(exc)[:500])
        dep.close()
        raise
    _save_logs(dep)
    try:
        return finish(state, code, run_events(dep), out, log, keep, lambda: down_all(dep), "the run on every host")
    finally:
        dep.close()


def _failed(results, out, log, state) -> bool:
    print(checks.table_text(results), file=out)
    if checks.exit_code(results) != checks.EXIT_OK:
        log("preflight failed: nothing was started")
        state.emit("up_end", status="preflight-failed")
        return True
    return False


def run_events(dep: Deployment, live: bool = False) -> list[dict]:
    """The deployer's events plus the trainer's (from its container when *live*, else the copy saved at the end),
    limited to the latest `up`."""
    text = None
    if live:
        try:
            text = fetch_metrics(dep)
        except HostError:
            text = None
    if text is None and dep.state.metrics_copy.exists():
        text = dep.state.metrics_copy.read_text()
    events = dep.state.deploy_events() + parse_events(text or "")
    starts = [e for e in events if e["event"] == "up_start"]
    return [e for e in events if e["time"] >= starts[-1]["time"]] if starts else events


def logs(dep: Deployment, roles: list[str], follow: bool = False, tail: int = 200, host: str | None = None) -> int:
    """The run's container logs from its hosts (those running one of *roles*, or all); with *follow*, new lines from
    every host at once, each prefixed with its host, until the containers stop or Ctrl-C."""
    if host is not None and host not in dep.hosts:
        raise LaunchError(f"--host {host!r}: the spec's hosts are {', '.join(dep.hosts)}")
    roles_of = {h.name: set(h.roles) for h in dep.res.spec.hosts}
    names = [n for n in ([host] if host else dep.hosts) if not roles or set(roles) & roles_of[n]]
    if not follow:
        for name in names:
            print(f"===== host {name}")
            print(dep.project(name).logs(tail=tail, roles=roles), flush=True)
        return 0
    printing = threading.Lock()

    def follow_one(name: str) -> None:
        project = dep.project(name)
        for line in dep.hosts[name].lines(project.compose_argv(*project.logs_args(roles, tail, follow=True))):
            with printing:
                print(f"{name} | {line}", flush=True)

    threads = [threading.Thread(target=follow_one, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        dep.close()  # ends the remote `docker compose logs --follow`
    return 0


def status_facts(res: Resolved, ssh: SshOptions) -> tuple[list[dict], list[dict], dict | None]:
    """What `status` shows of a run on its hosts — container states, the run's events, checkpoint headroom —
    gathered at once, every query bounded by STATUS_QUERY_S: a host whose engine does not answer is a row saying so."""
    options = replace(ssh, command_cap_s=STATUS_QUERY_S)
    dep, ctx = Deployment(res, options), checks.Context(res, ssh=options)
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            states = pool.submit(host_states, dep)
            events = pool.submit(run_events, dep, True)
            disk = pool.submit(checks.checkpoint_headroom, ctx)
            return states.result(), events.result(), disk.result()
    finally:
        dep.close()
        ctx.close()


def host_states(dep: Deployment) -> list[dict]:
    """Per host and role: container state and health (for status)."""
    rows = []
    for name, result in on_all(list(dep.hosts.values()), lambda h: dep.project(h.name).containers(strict=True)).items():
        if isinstance(result, HostError):
            rows.append({"host": name, "role": "-", "state": "unreachable", "health": str(result)})
            continue
        for c in result or [{"role": "-", "state": "no containers", "health": None}]:
            state = state_words(c["state"], c.get("exit_code")) if c["role"] != "-" else c["state"]
            rows.append({"host": name, "role": c["role"], "state": state, "health": c["health"]})
    return rows
