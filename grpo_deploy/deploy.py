"""Ordered bring-up of a run on its hosts, through their connectors (this machine's or SSH), one path for a run on
this machine, across hosts, or both: a run of the same name from another folder refused, preflight (facts read in
parallel, nothing changed), images built here and shipped where missing, the compose files and each host's render
put there, the last preflight (the cross-host adapter probe), the server and the trainer started (the trainer builds
its model while the server loads), readiness (model listed; one token generated, from the trainer's side), progress
per step under supervision, a summary. All-or-nothing: a failure after start stops what this `up` started on every
host. Also `down`."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable

from . import checks, run_view
from .deployment import Deployment
from .hosts import oneoff
from .hosts.connect import Host, HostError, SshOptions, on_all
from .hosts.project import RemoteProject
from .hosts.ship import Shipped, ship
from .names import READY_TIMEOUT_S, STATE_DIR, UP_RESTARTS
from .render import render_files
from .resolve import Resolved
from .run_images import build_images
from .run_state import LaunchError, RunState, require_kit
from .runtime.metrics import parse_events
from .runtime.values import ip_literal, parse_address
from .supervise import KILLED, EnginePatience, RoleDied, finish, supervise, view_words

POLL_S = 2.0
NOTE_EVERY_S = 15.0  # a line while the server loads
STOPPED = ("exited", "dead")


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


def refuse_foreign_run(dep: Deployment) -> None:
    """LaunchError when containers of a run of this name run on one of its hosts from another folder's render:
    starting would recreate them under that run (seen: a second `up` of `rehearsal` from another folder SIGTERMed the
    first one's server). A host that does not answer is left to preflight, which says so in its table."""

    def foreign(host: Host) -> list[dict]:
        project = dep.project(host.name)
        return [c for c in project.containers() if c["state"] == "running" and c["env_file"]
                and c["env_file"] != project.env_file]

    name = dep.res.spec.run.name
    for host_name, found in on_all(list(dep.hosts.values()), foreign).items():
        if isinstance(found, HostError) or not found:
            continue
        where = "this Docker engine" if dep.hosts[host_name].is_local else f"the Docker engine of {host_name}"
        origin = found[0]["env_file"].split(f"/{STATE_DIR}/", 1)[0]
        raise LaunchError(f"run {name} is already running on {where}, started from {origin} (containers "
                          f"{', '.join(sorted(c['name'] for c in found))}): stop it there with `grpo-deploy down`, "
                          "or give this run another run.name")


def _ship_all(dep: Deployment, log: Callable[[str], None]) -> list[Shipped]:
    res = dep.res
    wanted = {h.name: sorted({res.images[r] for r in checks.image_roles(res, h)})
              for h in res.spec.hosts if not dep.hosts[h.name].is_local}
    if not wanted:
        return []
    log(f"images to {', '.join(wanted)} (only what is missing)")
    last: dict[str, float] = {}

    def progress(key: str, line: str) -> None:
        if time.time() - last.get(key, 0) >= 10:
            last[key] = time.time()
            log(line)

    def to_host(host: Host) -> list[Shipped]:
        return [ship(tag, host, lambda line: progress(host.name, line)) for tag in wanted[host.name]]

    shipped: list[Shipped] = []
    for name, result in on_all([dep.hosts[n] for n in wanted], to_host).items():
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


def put_render(dep: Deployment, ips: dict[str, str], hosts: list[Host] | None = None) -> None:
    """The compose files and each host's render into the run's folder there."""
    def put(host: Host) -> int:
        project = dep.project(host.name)
        return project.put(render_files(dep.res, config_dir=project.config_dir, publish_ips=ips))

    for result in on_all(hosts if hosts is not None else list(dep.hosts.values()), put).values():
        if isinstance(result, HostError):
            raise result


def _container(project: RemoteProject, role: str) -> dict:
    """The role's container on its host (running or stopped); LaunchError when it is gone, HostError when the
    host's engine did not answer (ridden out by EnginePatience)."""
    c = project.container(role, strict=True)
    if c is None:
        raise LaunchError(f"the {role} container is gone on {project.host.name}")
    return c


def _server_ready(dep: Deployment) -> bool:
    """True once the server's health check passes (model listed); LaunchError when the server exited, or the trainer
    exited with an error while the server was loading (a bad config fails at once, not after the server is up)."""
    server = dep.role_project("server")
    c = _container(server, "server")
    if c["state"] in STOPPED:
        raise LaunchError(f"the vLLM server exited on {server.host.name} before it was ready "
                          f"(exit {c['exit_code']}):\n{server.tail(c['id'])}")
    if c["health"] == "healthy":
        return True
    trainer = dep.role_project("trainer")
    t = trainer.container("trainer", strict=True)
    if t is not None and t["state"] in STOPPED and int(t["exit_code"] or 0) != 0:
        raise LaunchError(f"the trainer exited on {trainer.host.name} (exit {t['exit_code']}) while the server was "
                          f"loading:\n{trainer.tail(t['id'])}")
    return False


def _last_server_line(dep: Deployment) -> str:
    server = dep.role_project("server")
    c = server.container("server")
    lines = server.tail(c["id"], 1).splitlines() if c else []
    return lines[-1][-110:] if lines else ""


def wait_server(dep: Deployment, log: Callable[[str], None], since: float) -> float:
    """Seconds from *since* until the server is ready; a line every NOTE_EVERY_S with its last log line."""
    patience = EnginePatience("waiting for the server")
    last_note = 0.0
    where = dep.role_host("server")
    while not patience.poll(lambda: _server_ready(dep), pause_s=POLL_S):
        elapsed = time.time() - since
        if elapsed > READY_TIMEOUT_S:
            raise LaunchError(f"the server was not ready after {READY_TIMEOUT_S} s (model not listed in /v1/models)")
        if elapsed - last_note >= NOTE_EVERY_S:
            with contextlib.suppress(HostError):
                log(f"waiting for the server on {where}: {elapsed:4.0f} s  | {_last_server_line(dep)}")
            last_note = elapsed
        time.sleep(POLL_S)
    return time.time() - since


def _health_argv(res: Resolved, host: str) -> list[str]:
    """From the trainer's side: the server lists the model and generates one token."""
    return ["python3", "-m", "grpo_deploy.runtime.health", "--role", "server", "--host", host,
            "--port", str(res.settings.vllm.port), "--model", res.settings.model.served_name, "--complete"]


def check_from_trainer(dep: Deployment, ips: dict[str, str]) -> str:
    """Server and trainer on two hosts: from the trainer's host, in a throw-away container of the trainer image, the
    server lists the model and generates — the gate before any training (a firewall or a wrong address fails here)."""
    res = dep.res
    trainer = dep.role_host("trainer")
    url = res.server_url_for(ips)
    argv = _health_argv(res, parse_address(url.split("//", 1)[1]).host)
    r = oneoff.run(dep.hosts[trainer], res.image_for("trainer"), argv, network="bridge", timeout=400)
    if not r.ok:
        raise LaunchError(f"the trainer's host {trainer} cannot use the server at {url}: {r.line()} "
                          "(a firewall, a wrong hosts[].publish, or the server's address resolving elsewhere there)")
    return r.out.strip().splitlines()[-1] if r.out.strip() else "ok"


def first_completion(dep: Deployment) -> threading.Thread:
    """Server and trainer on one host: a 1-token completion from inside the trainer's container, in the background
    (a `server_first_completion` event): proves the server generates and warms its first-request paths while the
    trainer spawns its rollout worker (the first generation on a cold CPU server took ~18 s, later ones ~0.1 s)."""
    project = dep.role_project("trainer")

    def run() -> None:
        start = time.time()
        c = project.container("trainer")
        r = project.host.run(["docker", "exec", c["id"], *_health_argv(dep.res, "server")], timeout=300) if c else None
        ok = r is not None and r.ok
        said = {} if ok else {"error": (r.line() if r is not None else "no trainer container")[:200]}
        dep.state.emit("server_first_completion", ok=not said, seconds=round(time.time() - start, 2), **said)

    thread = threading.Thread(target=run, name="first-completion", daemon=True)
    thread.start()
    return thread


def _snapshot(dep: Deployment) -> tuple[dict, str, dict | None]:
    """The trainer's container, its metrics text and the server's container, read once."""
    trainer = dep.role_project("trainer")
    c = _container(trainer, "trainer")
    text = trainer.read(c["id"], f"{dep.res.run_dir}/metrics.jsonl") or ""
    return c, text, dep.role_project("server").container("server", strict=True)


def follow(dep: Deployment, log: Callable[[str], None], since: float) -> int:
    """Progress per step until the trainer exits (its exit code); RoleDied when the server's container exits while
    the trainer has not finished cleanly, or the trainer is killed."""
    from . import status

    res = dep.res
    total = res.engine_info.total_steps(res)
    seen, last_step = 0, 0
    patience = EnginePatience("following the trainer")
    while True:
        c, text, server = patience.poll(lambda: _snapshot(dep), pause_s=POLL_S)
        steps = [e for e in parse_events(text) if e["event"] == "step" and e["time"] >= since]
        for e in steps[seen:]:
            log(status.progress_line(e, total))
            last_step = int(e.get("step", last_step))
        seen = len(steps)
        trainer_done = c["state"] in STOPPED and int(c["exit_code"] or 0) == 0
        if (server is None or server["state"] in STOPPED) and not trainer_done:
            dep.state.metrics_copy.write_text(text)
            raise RoleDied("server", int(server["exit_code"] or 1) if server else -1, last_step)
        if c["state"] in STOPPED:
            dep.state.metrics_copy.write_text(text)
            if int(c["exit_code"]) == KILLED:
                raise RoleDied("trainer", KILLED, last_step)
            return int(c["exit_code"])
        time.sleep(POLL_S)


def note_server_view(dep: Deployment) -> None:
    """When the trainer stopped because the server could not read an adapter, look at that path from inside the
    server container, as the server's user (`storage_faults view`), and record what it sees (a `server_view` event):
    the trainer only knows its own view. Best effort: a server that is gone leaves the trainer's words alone."""
    res, state = dep.res, dep.state
    text = run_view.fetch_metrics(dep) or (state.metrics_copy.read_text() if state.metrics_copy.exists() else "")
    faults = [e for e in parse_events(text) if e["event"] == "storage_fault" and e.get("kind") == "adapter-unreadable"]
    server = dep.role_project("server")
    c = server.container("server")
    if not faults or c is None or c["state"] != "running":
        return
    path = faults[-1].get("path", "")
    r = server.host.run(["docker", "exec", "--user", res.identities["server"].user, c["id"], "python3", "-m",
                         "grpo_deploy.runtime.storage_faults", "view", "--", path], timeout=120)
    seen = json.loads(r.out.strip().splitlines()[-1]) if r.ok and r.out.strip() else None
    if seen:
        state.emit("server_view", path=path, words=view_words(seen), uid=seen.get("uid"), gid=seen.get("gid"))


def save_logs(dep: Deployment) -> None:
    parts = []
    for name in dep.hosts:
        try:
            parts.append(f"===== host {name}\n{dep.project(name).logs(tail=2000)}")
        except HostError as exc:
            parts.append(f"===== host {name}: {exc}")
    (dep.state.dir / "logs.txt").write_text("\n".join(parts))


def down_all(dep: Deployment, volumes: bool = False, warn: bool = True) -> list[str]:
    """Stop the run's containers on every host (and its volumes with *volumes*); a host where no `up` put the
    render gets it first, so that `down` from a new folder still finds the run by its compose project. Returns what
    failed, a line per host (each also printed as a warning with *warn*: the other hosts are stopped all the same)."""
    def down(host: Host) -> None:
        project = dep.project(host.name)
        if not project.has_render():
            put_render(dep, {}, [host])
        r = project.down(volumes)
        if not r.ok:
            raise HostError(host.name, f"docker compose down failed: {r.line()}", "see `docker ps` there")

    failed = []
    for result in on_all(list(dep.hosts.values()), down).values():
        if isinstance(result, HostError):
            if warn:
                print(f"warning: {result}", file=sys.stderr)
            failed.append(str(result))
    return failed


def down(res: Resolved, ssh: SshOptions, volumes: bool = False) -> None:
    """`down`: LaunchError naming the hosts where the run could not be stopped."""
    require_kit()
    dep = Deployment(res, ssh)
    try:
        failed = down_all(dep, volumes=volumes, warn=False)
    finally:
        dep.close()
    if failed:
        raise LaunchError(f"the run was not stopped on {len(failed)} host(s): {'; '.join(failed)}")


def up(res: Resolved, ssh: SshOptions, keep: bool = False, fresh: bool = False, out=sys.stdout,
       restarts: int = UP_RESTARTS) -> int:
    """Bring the run up on its hosts, follow it to the end, summarise, and (unless keep) stop it."""
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
        refuse_foreign_run(dep)
        log(f"preflight on {', '.join(dep.hosts)} (facts only: nothing is changed)")
        ctx = checks.Context(res, ssh=ssh, connectors=dep.hosts)
        if _failed(checks.run_checks(ctx, only=checks.before_shipping()), out, log, state):
            return checks.EXIT_FAILED
        client = ctx.docker()  # images are built (or refreshed) here, then shipped from here
        if client is None:
            raise LaunchError(f"no Docker engine answers on this machine: {ctx.docker_error}")
        state.emit("images_ready", build_s=round(build_images(client, res, log), 2))
        shipped = _ship_all(dep, log)
        state.emit("shipped", items=[s.__dict__ for s in shipped])
        ips = publish_ips(dep)
        put_render(dep, ips)
        log(f"render and compose files on {', '.join(dep.hosts)}; the server publishes on "
            f"{ips or 'loopback (same host)'}")
        ctx.forget_facts()  # the images are there now
        if _failed(checks.run_checks(ctx, only=checks.after_shipping()), out, log, state):
            return checks.EXIT_FAILED
        state.emit("preflight_done")
        server_host, trainer_host = dep.role_host("server"), dep.role_host("trainer")
        if fresh:
            main = dep.role_host(res.engine_info.main_role)
            source, _ = oneoff.share_source(res, res.host_for(res.engine_info.main_role))
            where = f"the share {source}" if source.startswith("/") else f"volume {source}"
            log(f"--fresh: removing {res.run_dir} on {where} ({main})")
            failed = oneoff.remove_run_dir(dep.hosts[main], res)
            if failed:
                raise LaunchError(failed)
        start = time.time()
        started.extend((server_host, trainer_host))
        # The trainer starts as soon as the server's container runs (`--no-deps`: compose would otherwise hold it
        # until the server is healthy, +15 s to the first step): it builds its model while the server loads, and TRL
        # waits for the server before its first request. Readiness stays the gate: if it fails, both are rolled back.
        log(f"starting the vLLM server on {server_host} and the trainer on {trainer_host} (the trainer builds its "
            "model while the server loads)")
        dep.project(server_host).up("server")
        dep.project(trainer_host).up("trainer")
        state.emit("trainer_started")
        ready_s = wait_server(dep, log, start)
        state.emit("server_ready", seconds=round(ready_s, 2))
        if server_host == trainer_host:
            first_completion(dep)
            log(f"server ready in {ready_s:.1f} s (served model listed in /v1/models); progress per optimizer step:")
        else:
            log(f"server ready in {ready_s:.1f} s; from {trainer_host}: {check_from_trainer(dep, ips)}; progress per "
                "optimizer step:")

        def restart(role: str) -> float:
            if role == "trainer":
                dep.project(trainer_host).up("trainer")
                return 0.0
            dep.project(trainer_host).compose("stop", "trainer")
            restart_at = time.time()
            dep.project(server_host).up("server")
            dep.project(trainer_host).up("trainer")
            return wait_server(dep, log, restart_at)

        code = supervise(state, log, start - 1, restarts, lambda since: follow(dep, log, since), restart)
    except (LaunchError, HostError, KeyboardInterrupt) as exc:
        if started:
            log(f"rolling back: stopping what this up started on {', '.join(dict.fromkeys(started))}")
            save_logs(dep)
            down_all(dep)
        state.emit("up_end", status="failed", error=str(exc)[:500])
        dep.close()
        raise
    try:
        if code != 0:
            with contextlib.suppress(Exception):  # a diagnosis; a slow or failing engine here must not hide the stop
                note_server_view(dep)
        save_logs(dep)
        return finish(state, code, run_view.run_events(dep), out, log, keep, lambda: down_all(dep),
                      f"the run on {', '.join(dep.hosts)}")
    finally:
        dep.close()


def _failed(results, out, log, state) -> bool:
    print(checks.table_text(results), file=out)
    if checks.exit_code(results) != checks.EXIT_OK:
        log("preflight failed: nothing was started")
        state.emit("up_end", status="preflight-failed")
        return True
    return False
