"""Ordered bring-up of a run on its hosts, through their connectors (this machine's or SSH), one path for a run on
this machine, across hosts, or both: a run of the same name from another folder refused, preflight (facts read in
parallel, nothing changed), images built here and shipped where missing, the run's folder on the share claimed
(another run's refused; --fresh moves the old one aside once every check passed: grpo_deploy.deploy.run_folder), the
compose files and each host's render put there, the last preflight (the cross-host adapter probe), the engine's own
bring-up (grpo_deploy.deploy.bringup: its roles started in order, up to ready, progress per step) under supervision, a
summary. All-or-nothing: a failure after start stops what this `up` started on every host. Also `down`."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable

from grpo_deploy import preflight
from grpo_deploy.common.readback import ReadRefused
from grpo_deploy.common.shown import printable
from grpo_deploy.common.term import fit
from grpo_deploy.deploy import run_folder, run_view
from grpo_deploy.deploy.bringup import BRINGUP
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.deploy.images import build_images
from grpo_deploy.deploy.run_state import LaunchError, RunState, require_kit
from grpo_deploy.deploy.supervise import finish, supervise
from grpo_deploy.hosts.connect import Host, HostError, SshOptions, on_all
from grpo_deploy.hosts.ship import Shipped, ship
from grpo_deploy.names import STATE_DIR, UP_RESTARTS
from grpo_deploy.render import render_files
from grpo_deploy.spec.resolve import Resolved


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
    wanted = {h.name: sorted({res.images[r] for r in preflight.image_roles(res, h)})
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
    """The compose files and each host's render into the run's folder there, with the run's token in its 0600 file
    (hosts/project.py)."""
    def put(host: Host) -> int:
        project = dep.project(host.name)
        return project.put(render_files(dep.res, config_dir=project.config_dir, publish_ips=ips), token)

    token = dep.state.token()  # the run's, kept across `up`s: a restarted role and a resumed run pass the same
    for result in on_all(hosts if hosts is not None else list(dep.hosts.values()), put).values():
        if isinstance(result, HostError):
            raise result


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
                print(f"warning: {printable(result)}", file=sys.stderr)
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
       restarts: int = UP_RESTARTS, scratch: bool = False) -> int:
    """Bring the run up on its hosts, follow it to the end, summarise, and (unless keep) stop it. fresh: the run's
    old folder moved aside whole first (removed with *scratch*: the tuner's trials)."""
    res.engine_info.refuse("up", LaunchError)
    require_kit()
    if not fresh:
        run_folder.refuse_other_run(res)  # a share seen from here: refused before anything is built or written
    with RunState(res).up_lock():
        return _up(res, ssh, keep, fresh, out, restarts, scratch)


def up_log(out, clock: Callable[[], str] = lambda: time.strftime("%H:%M:%S")) -> Callable[[str], None]:
    """`up`'s progress lines to *out*: a timestamp, then the line through printable (a line may quote what a container
    or a host's command wrote: a step's figures, a fault's message, a refusal); on a terminal wrapped at its width
    under the timestamp (term.fit), elsewhere one event a line. *clock*: the timestamp (a replay passes the recorded
    one: scripts/replay_up.py)."""
    def log(msg: str) -> None:
        print(fit(printable(msg), out, f"[{clock()}] "), file=out, flush=True)
    return log


def _up(res: Resolved, ssh: SshOptions, keep: bool, fresh: bool, out, restarts: int = UP_RESTARTS,
        scratch: bool = False) -> int:
    log = up_log(out)

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
        ctx = dep.context
        if _failed(preflight.run_checks(ctx, only=preflight.before_shipping()), out, log, state):
            return preflight.EXIT_FAILED
        client = ctx.docker()  # images are built (or refreshed) here, then shipped from here
        if client is None:
            raise LaunchError(f"no Docker engine answers on this machine: {ctx.docker_error}")
        state.emit("images_ready", build_s=round(build_images(client, res, log), 2))
        shipped = _ship_all(dep, log)
        state.emit("shipped", items=[s.__dict__ for s in shipped])
        main = dep.hosts[dep.role_host(res.engine_info.main_role)]
        if not fresh:  # another run's folder refused before the render is put and the share probed
            run_folder.claim(main, res, False, log)
        bringup = BRINGUP[res.engine]
        ips = bringup.addresses(dep)
        put_render(dep, ips)
        log(f"render and compose files on {', '.join(dep.hosts)}; {bringup.addresses_words(ips)}")
        ctx.forget_facts()  # the images are there now
        if _failed(preflight.run_checks(ctx, only=preflight.after_shipping()), out, log, state):
            return preflight.EXIT_FAILED
        state.emit("preflight_done")
        if fresh:  # the old folder moved aside once every check passed, before anything starts
            run_folder.claim(main, res, True, log, discard=scratch)
        start = time.time()
        started.extend(bringup.hosts(dep))
        bringup.start(dep, log, ips, start)
        code = supervise(state, log, start - 1, restarts, lambda since: bringup.follow(dep, log, since),
                         lambda role: bringup.restart(dep, log, role))
    except (LaunchError, HostError, ReadRefused, KeyboardInterrupt) as exc:  # ReadRefused: a container's file
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
                bringup.after_failure(dep)
        save_logs(dep)
        return finish(state, code, run_view.run_events(dep), out, log, keep, lambda: down_all(dep),
                      f"the run on {', '.join(dep.hosts)}")
    finally:
        dep.close()


def _failed(results, out, log, state) -> bool:
    print(preflight.table_text(results), file=out)
    if preflight.exit_code(results) != preflight.EXIT_OK:
        log("preflight failed: nothing was started")
        state.emit("up_end", status="preflight-failed")
        return True
    return False
