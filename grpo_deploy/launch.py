"""Ordered bring-up of a run on the local host: render, build or refresh images, preflight, server, readiness,
trainer, progress, summary, tear-down. All-or-nothing: a failure after start rolls back what this `up` started.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import checks, compose, facts, status
from .hosts import engine, oneoff
from .hosts.connect import LocalHost
from .kit_data import FOLDERS, KitDataMissing, kit_dir
from .names import GID_LABEL, READY_TIMEOUT_S, STATE_DIR, UID_LABEL, UP_RESTARTS, project_name
from .render import render_files
from .render_folder import WriteRefused, write_tree
from .resolve import Resolved
from .runtime.metrics import event_line, event_record, parse_events

STATE_ROOT = Path(STATE_DIR)


class LaunchError(RuntimeError):
    pass


@dataclass
class RunState:
    """The deployer's local folder for one run: the render, its own events, and copies of the run's results."""

    res: Resolved
    root: Path = STATE_ROOT

    @property
    def dir(self) -> Path:
        return (self.root / self.res.spec.run.name).resolve()

    @property
    def render_dir(self) -> Path:
        return self.dir / "render"

    @property
    def deploy_log(self) -> Path:
        return self.dir / "deploy.jsonl"

    @property
    def metrics_copy(self) -> Path:
        return self.dir / "metrics.jsonl"

    def project(self, host: str = "local") -> compose.Project:
        return compose.Project(self.render_dir / "hosts" / f"{host}.env", project_name(self.res.spec.run.name))

    def emit(self, event: str, **fields) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.deploy_log.open("a", encoding="utf-8") as f:
            f.write(event_line(event_record(event, **fields)) + "\n")

    def deploy_events(self) -> list[dict]:
        return parse_events(self.deploy_log.read_text()) if self.deploy_log.exists() else []

    @contextlib.contextmanager
    def up_lock(self) -> Iterator[None]:
        """One `up` of this run at a time on this machine: a second one — from this folder or any other of this user
        — is refused at once, naming the first (flocks: released by the kernel when the holder exits, however it
        exits). Runs of the same name started by another user or left up (`--keep`) from another folder are caught
        on the Docker engine (refuse_foreign_run)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        host_wide = Path(tempfile.gettempdir()) / f"grpo-deploy-{os.getuid()}"
        host_wide.mkdir(mode=0o700, exist_ok=True)
        with _flock(self.dir / "up.lock", f"run {self.res.spec.run.name} is already being started from this folder"), \
                _flock(host_wide / f"up-{self.res.spec.run.name}.lock",
                       f"run {self.res.spec.run.name} is already being started from another folder"):
            yield


@contextlib.contextmanager
def _flock(path: Path, busy: str) -> Iterator[None]:
    """Hold an exclusive flock on *path*, recording who holds it; LaunchError (busy + the holder) when taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise LaunchError(f"{busy} ({holder}): follow it with `grpo-deploy status --watch`, or stop it with "
                          "`grpo-deploy down`, then run up again") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"`grpo-deploy up` in {os.getcwd()}, pid {os.getpid()}, since "
                      f"{time.strftime('%H:%M:%S')}".encode(), 0)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


ENV_FILE_LABEL = "com.docker.compose.project.environment_file"


def refuse_foreign_run(client, state: RunState) -> None:
    """LaunchError when containers of a run of this name run on this engine from another folder's render: starting
    would recreate them under that run (seen: a second `up` of `rehearsal` from another folder SIGTERMed the
    first one's server)."""
    mine = str(state.render_dir / "hosts" / "local.env")
    name = state.res.spec.run.name
    foreign = [c for c in compose.containers(client, name, all_=False) if c.labels.get(ENV_FILE_LABEL, mine) != mine]
    if foreign:
        origin = foreign[0].labels[ENV_FILE_LABEL].split(f"/{STATE_ROOT.name}/", 1)[0]
        raise LaunchError(f"run {name} is already running on this Docker engine, started from {origin} (containers "
                          f"{', '.join(sorted(c.name for c in foreign))}): stop it there with `grpo-deploy down`, "
                          "or give this run another run.name")


def write_render(state: RunState) -> None:
    """The render into the run's folder; files of the earlier render that this one no longer has are removed, nothing
    else (grpo_deploy.render_folder.write_tree). File by file, in place: the config/ folder may be bind-mounted by
    containers of this run still up (`up --keep`)."""
    try:
        write_tree(render_files(state.res, config_dir=str(state.render_dir / "config")), state.render_dir)
    except WriteRefused as exc:
        raise LaunchError(f"cannot render run {state.res.spec.run.name}: {exc}") from None


def _require_local(res: Resolved) -> None:
    remote = [h.name for h in res.spec.hosts if h.address != "local"]
    if remote:
        raise LaunchError(f"hosts {', '.join(remote)} are remote: the multi-host deployer is not built yet; "
                          "this version starts runs on the local host only (render + compose files work everywhere)")


def require_kit() -> dict[str, Path]:
    """The kit's compose/ and images/ folders (grpo_deploy.kit_data), checked before anything is started."""
    try:
        return {name: kit_dir(name) for name in FOLDERS}
    except KitDataMissing as exc:
        raise LaunchError(str(exc)) from None


def build_images(client, res: Resolved, log: Callable[[str], None]) -> float:
    """Build or refresh local images in-process (grpo_deploy.image_build: one progress line per step, full output in
    a log whose path is printed). Returns the seconds spent building (0 when every image was current), which `up`
    records so its start-up figure can leave build time out.

    The cpu image is handed to the build even when it exists: the build compares its inputs' hash with the image's
    label and returns in seconds when nothing changed, and rebuilds only the code layer when the kit's code did, so
    a kit update never runs against an image holding older runtime code.
    """
    from .image_build import build as image_build
    from .image_build import places
    from .image_build.door import BadValue
    from .image_build.progress import StepFailed
    from .image_build.recipes import RECIPES

    spent = 0.0
    for tag in sorted(set(res.images.values())):
        labels = facts.image_labels(client, tag)
        cpu = res.profiles[res.spec.hosts[0].name].name == "cpu"
        if labels is not None and not (cpu and res.spec.images.build):
            continue
        if not res.spec.images.build:
            raise LaunchError(f"image {tag} is not on the local engine and images.build is false: load or build it")
        if not cpu:
            airgap = [r.name for r in RECIPES.values() if r.tag == tag]
            how = f"`grpo-deploy images build {' '.join(airgap)}` (from wheels, no registry) or " if airgap else ""
            raise LaunchError(f"image {tag} is missing; build it with {how}`docker buildx bake -f "
                              "images/docker-bake.hcl` in a checkout on a machine of that architecture (see "
                              "images/README.md), then load it on the host")
        if labels is not None:  # keeps the UID/GID it was built for; preflight says when the run wants another
            uid, gid = int(labels.get(UID_LABEL, "1000")), int(labels.get(GID_LABEL, "1000"))
        else:
            uid, gid = res.identities["trainer"].uid, res.identities["trainer"].gid
            log(f"building {tag} for UID {uid}:{gid} (a first build installs ~3.5 GB of wheels: minutes)")
        start = time.monotonic()
        retry = f"grpo-deploy images build cpu --tag {tag} --uid {uid} --gid {gid}"
        try:
            result = image_build.build(client, RECIPES["cpu"], places.images_dir(), places.package_dir(),
                                       places.build_dir(), tag=tag, uid=uid, gid=gid)
        except (StepFailed, BadValue) as exc:
            raise LaunchError(f"building {tag} failed: {exc}; retry with: {retry}") from None
        if result.code_built or result.deps_built:
            spent += time.monotonic() - start
        else:
            log(f"{tag} is current (its inputs are unchanged)")
    return spent


ENGINE_STALL_S = 120.0  # how long a busy Docker engine may leave polls unanswered before `up` gives up


class EnginePatience:
    """Rides out a Docker engine that is slow to answer one poll (seen in CI: a 10 s read timeout on a loaded
    2-core machine killed a healthy run); gives up with one line once it has not answered for ENGINE_STALL_S."""

    def __init__(self, what: str, limit_s: float = ENGINE_STALL_S):
        self.what, self.limit_s, self.since = what, limit_s, None

    def transient(self, exc: Exception) -> bool:
        import docker
        import requests

        if isinstance(exc, (requests.exceptions.Timeout, requests.exceptions.ConnectionError)):
            return True
        return isinstance(exc, docker.errors.APIError) and exc.is_server_error()

    def failed(self, exc: Exception) -> None:
        """Record a failed poll: returns to retry, raises LaunchError when the engine has been silent too long."""
        if not self.transient(exc):
            raise exc
        now = time.time()
        self.since = self.since or now
        if now - self.since > self.limit_s:
            raise LaunchError(f"the Docker engine did not answer for {self.limit_s:.0f} s while {self.what} "
                              f"({type(exc).__name__}): check `docker info` and the host's load") from None

    def answered(self) -> None:
        self.since = None

    def poll(self, read: Callable[[], Any], pause_s: float):
        """*read*() once the engine answers it: a slow engine is retried every *pause_s*; LaunchError and any error
        that is not the engine being slow pass through."""
        while True:
            try:
                value = read()
            except LaunchError:
                raise
            except Exception as exc:  # failed() re-raises what is not a slow engine
                self.failed(exc)
                time.sleep(pause_s)
                continue
            self.answered()
            return value


def wait_ready(client, state: RunState, timeout: float, log: Callable[[str], None],
               since: float | None = None) -> float:
    """Wait until the server container's healthcheck (served model listed in /v1/models) passes; a trainer that
    dies meanwhile (bad config, import error) fails the wait at once instead of after the server is up."""
    start = since or time.time()
    last_note = 0.0
    patience = EnginePatience("waiting for the server")
    while True:
        ready = patience.poll(lambda: _server_ready(client, state), pause_s=1)
        if ready is not None:
            return time.time() - start
        elapsed = time.time() - start
        if elapsed > timeout:
            raise LaunchError(f"the server was not ready after {timeout:.0f} s (model not listed in /v1/models)")
        if elapsed - last_note >= 10:
            with contextlib.suppress(Exception):
                last_line = ready_last_line(client, state)
                log(f"waiting for the server: {elapsed:4.0f} s  | {last_line}")
                last_note = elapsed
        time.sleep(1)


def ready_last_line(client, state: RunState) -> str:
    found = compose.containers(client, state.res.spec.run.name, "server")
    return found[0].logs(tail=1).decode(errors="replace").strip()[-110:] if found else ""


def _server_ready(client, state: RunState) -> bool | None:
    """True when the server is healthy, None while it loads; LaunchError when the server or the trainer died."""
    found = compose.containers(client, state.res.spec.run.name, "server")
    if not found:
        raise LaunchError("the server container disappeared")
    c = found[0]
    c.reload()
    health = (c.attrs.get("State", {}).get("Health") or {}).get("Status")
    if c.status in ("exited", "dead"):
        tail = c.logs(tail=15).decode(errors="replace")
        raise LaunchError(f"the vLLM server exited before it was ready (exit {c.attrs['State'].get('ExitCode')}):"
                          f"\n{tail}")
    if health == "healthy":
        return True
    for trainer in compose.containers(client, state.res.spec.run.name, "trainer"):
        trainer.reload()
        if trainer.status in ("exited", "dead") and trainer.attrs["State"].get("ExitCode", 0) != 0:
            tail = trainer.logs(tail=15).decode(errors="replace")
            raise LaunchError(f"the trainer exited while the server was loading:\n{tail}")
    return None


def first_completion(state: RunState) -> threading.Thread:
    """A 1-token completion against the served model, in the background: proves the server generates, and warms
    its first-request paths while the trainer spawns its rollout worker (the first generation on a cold CPU
    server took ~18 s, later ones ~0.1 s)."""
    res = state.res
    url = f"http://127.0.0.1:{res.settings.vllm.port}/v1/completions"
    body = json.dumps({"model": res.settings.model.served_name, "prompt": "ok", "max_tokens": 1}).encode()

    def run() -> None:
        start = time.time()
        try:
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as resp:
                ok = resp.status == 200 and bool(json.load(resp).get("choices"))
        except (OSError, ValueError) as exc:
            state.emit("server_first_completion", ok=False, error=str(exc)[:200], seconds=round(time.time() - start, 2))
            return
        state.emit("server_first_completion", ok=ok, seconds=round(time.time() - start, 2))

    thread = threading.Thread(target=run, name="first-completion", daemon=True)
    thread.start()
    return thread


def fetch_metrics(client, res: Resolved) -> str | None:
    path = f"{res.run_dir}/metrics.jsonl"
    for role in ("server", "trainer"):
        for c in compose.containers(client, res.spec.run.name, role):
            text = compose.read_file(c, path)
            if text is not None:
                return text
    return None


def fetch_metrics_safe(res: Resolved) -> str | None:
    try:
        return fetch_metrics(engine.client(), res)
    except engine.DockerUnavailable:
        return None


KILLED = 137  # a container's exit code after SIGKILL: `docker kill`, the kernel's OOM killer, a host reboot


class RoleDied(Exception):
    """A role's container exited mid-run in a way a restart recovers from: the server exited while the trainer was
    still training, or the trainer was killed (SIGKILL) — an exception in the trainer (exit 1) is not retried."""

    def __init__(self, role: str, exit_code: int, step: int):
        super().__init__(f"{role} exit {exit_code}")
        self.role, self.exit_code, self.step = role, exit_code, step


def exit_words(code: int) -> str:
    return f"code {code}" + (" (SIGKILL: killed, or out of memory)" if code == KILLED else "")


def state_words(state: str, exit_code: int | None) -> str:
    """A container's state for status: its exit code (and what 137 means) once it has stopped."""
    return state + (f" ({exit_words(int(exit_code or 0))})" if state in ("exited", "dead") else "")


def _run_snapshot(client, res: Resolved) -> tuple[Any, list, str]:
    """The trainer's container, the server's containers (reloaded) and the metrics text, read once."""
    trainers = compose.containers(client, res.spec.run.name, "trainer")
    if not trainers:
        raise LaunchError("the trainer container disappeared")
    trainer = trainers[0]
    trainer.reload()
    servers = compose.containers(client, res.spec.run.name, "server")
    for server in servers:
        server.reload()
    return trainer, servers, fetch_metrics(client, res) or ""


def follow_trainer(client, state: RunState, log: Callable[[str], None], since: float) -> int:
    """Print a progress line per optimizer step until the trainer exits; return its exit code. Raises RoleDied when
    the server's container exits first or the trainer is killed."""
    res = state.res
    max_steps = res.engine_info.total_steps(res)
    seen = 0
    last_step = 0
    patience = EnginePatience("following the trainer")
    while True:
        trainer, servers, text = patience.poll(lambda: _run_snapshot(client, res), pause_s=2)
        steps = [e for e in parse_events(text) if e["event"] == "step" and e["time"] >= since]
        for e in steps[seen:]:
            log(status.progress_line(e, max_steps))
            last_step = int(e.get("step", last_step))
        seen = len(steps)
        dead = [s for s in servers if s.status in ("exited", "dead")]
        if not servers or dead:
            state.metrics_copy.write_text(text)
            code = int(dead[0].attrs["State"].get("ExitCode", 1)) if dead else -1
            if trainer.status not in ("exited", "dead") or trainer.attrs["State"].get("ExitCode", 1) != 0:
                raise RoleDied("server", code, last_step)
        if trainer.status in ("exited", "dead"):
            state.metrics_copy.write_text(text)
            code = int(trainer.attrs["State"].get("ExitCode", 1))
            if code == KILLED:
                raise RoleDied("trainer", code, last_step)
            return code
        time.sleep(2)


def supervise(state: RunState, log: Callable[[str], None], since: float, restarts: int,
              follow: Callable[[float], int], restart: Callable[[str], float]) -> int:
    """Follow the trainer to its end (*follow*(since) -> exit code). Each time the server dies mid-run or the trainer
    is killed (SIGKILL, out of memory), *restart*(role) starts what is needed again — for the server: the trainer
    stopped, both started, the server's new ready time returned — and the trainer resumes from its newest complete
    checkpoint (the half-written one quarantined); at most *restarts* times, then the run fails in one line."""
    used = 0
    while True:
        try:
            return follow(since)
        except RoleDied as died:
            what = "the vLLM server" if died.role == "server" else "the trainer"
            if used >= restarts:
                raise LaunchError(f"{what} exited with {exit_words(died.exit_code)} at step {died.step}; "
                                  f"{restarts} restart(s) allowed (--restarts) are used up; its last lines: "
                                  f"grpo-deploy logs --role {died.role}") from None
            used += 1
            state.emit("role_died", role=died.role, exit_code=died.exit_code, step=died.step, restart=used)
            again = "the server and the trainer" if died.role == "server" else "the trainer"
            log(f"{what} exited with {exit_words(died.exit_code)} at step {died.step}: restarting {again}; the "
                f"trainer resumes from its newest complete checkpoint (restart {used} of {restarts})")
            since = time.time()  # steps from here on are the resumed trainer's (those before were printed)
            ready_s = restart(died.role)
            state.emit("role_restarted", role=died.role, seconds=round(ready_s, 2), restart=used)
            if died.role == "server":
                log(f"server ready again in {ready_s:.1f} s; progress per optimizer step:")


def up(res: Resolved, keep: bool = False, fresh: bool = False, out=sys.stdout, restarts: int = UP_RESTARTS) -> int:
    """Bring the run up on this host, follow it to the end, summarise, and (unless keep) stop it."""
    _require_local(res)
    require_kit()
    state = RunState(res)
    with state.up_lock():
        return _up(state, keep, fresh, out, restarts)


def _up(state: RunState, keep: bool, fresh: bool, out, restarts: int = UP_RESTARTS) -> int:
    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=out, flush=True)

    res = state.res
    if state.deploy_log.exists():
        state.deploy_log.unlink()
    state.emit("up_start", run=res.spec.run.name, engine=res.engine)
    res.engine_info.refuse("up", LaunchError)
    write_render(state)
    log(f"rendered run {res.spec.run.name} into {state.render_dir}")
    try:
        client = engine.client()
    except engine.DockerUnavailable as exc:
        raise LaunchError(f"no Docker engine answers: {exc}") from None
    refuse_foreign_run(client, state)
    build_s = build_images(client, res, log)
    state.emit("images_ready", build_s=round(build_s, 2))

    log("preflight")
    results = checks.run_checks(checks.Context(res, client=client))
    print(checks.table_text(results), file=out)
    if checks.exit_code(results) != checks.EXIT_OK:
        log("preflight failed: nothing was started")
        state.emit("up_end", status="preflight-failed")
        return checks.EXIT_FAILED
    state.emit("preflight_done")

    project = state.project()
    started = False
    try:
        if fresh:
            source, _ = oneoff.share_source(res, res.host_for(res.engine_info.main_role))
            where = f"the share {source}" if source.startswith("/") else f"volume {source}"
            log(f"--fresh: removing {res.run_dir} on {where}")
            failed = oneoff.remove_run_dir(LocalHost(), res)
            if failed:
                raise LaunchError(failed)
        log("starting the vLLM server and the trainer (the trainer imports and builds its model while the "
            "server loads; TRL waits for the server before its first request)")
        started = True
        trainer_start = time.time()
        project.up("server")
        # A separate call with --no-deps: listed together, compose would honour depends_on (service_healthy) and
        # hold the trainer back until the server is ready (measured: +15 s to the first step).
        project.up("trainer", no_deps=True)
        state.emit("trainer_started")
        ready_s = wait_ready(client, state, READY_TIMEOUT_S, log, since=trainer_start)
        state.emit("server_ready", seconds=round(ready_s, 2))
        log(f"server ready in {ready_s:.1f} s (served model listed in /v1/models); progress per optimizer step:")
        first_completion(state)

        def restart(role: str) -> float:
            if role == "trainer":
                project.up("trainer", no_deps=True)
                return 0.0
            project.run("stop", "trainer", capture=True, check=False)
            restart_at = time.time()
            project.up("server")
            project.up("trainer", no_deps=True)
            return wait_ready(client, state, READY_TIMEOUT_S, log, since=restart_at)

        code = supervise(state, log, trainer_start - 1, restarts,
                         lambda since: follow_trainer(client, state, log, since), restart)
    except (LaunchError, compose.ComposeError, KeyboardInterrupt) as exc:
        if started:
            log(f"rolling back: stopping what this up started ({type(exc).__name__})")
            _save_logs(project, state)
            project.down()
        state.emit("up_end", status="failed", error=str(exc)[:500])
        if isinstance(exc, compose.ComposeError):
            raise LaunchError(f"{exc}\nnothing of this run is left running") from None
        raise
    if code != 0:
        with contextlib.suppress(Exception):  # a diagnosis; a slow or failing engine here must not hide the stop
            note_server_view(client, state)
    _save_logs(project, state)
    return finish(state, code, run_events(state), out, log, keep, project.down, "the stack")


def note_server_view(client, state: RunState) -> None:
    """When the trainer stopped because the server could not read an adapter, look at that path from inside the
    server container, as the server's user (`storage_faults view`), and record what it sees (a `server_view` event):
    the trainer only knows its own view. Best effort: a server that is gone leaves the trainer's words alone."""
    res = state.res
    text = fetch_metrics(client, res) or (state.metrics_copy.read_text() if state.metrics_copy.exists() else "")
    faults = [e for e in parse_events(text) if e["event"] == "storage_fault" and e.get("kind") == "adapter-unreadable"]
    servers = compose.containers(client, res.spec.run.name, "server", all_=False)
    if not faults or not servers:
        return
    path = faults[-1].get("path", "")
    code, output = servers[0].exec_run(["python3", "-m", "grpo_deploy.runtime.storage_faults", "view", path],
                                       user=res.identities["server"].user)
    seen = json.loads(output.decode(errors="replace").strip().splitlines()[-1]) if code == 0 else None
    if seen:
        state.emit("server_view", path=path, words=view_words(seen), uid=seen.get("uid"), gid=seen.get("gid"))


def view_words(seen: dict) -> str:
    """storage_faults.PathView.words() for the JSON the server container printed."""
    from .runtime.storage_faults import PathView

    return PathView(**{k: seen.get(k) for k in ("path", "blocked", "problem", "mode", "owner")}).words()


def finish(state: RunState, code: int, events: list[dict], out, log: Callable[[str], None], keep: bool,
           stop: Callable[[], None], what: str) -> int:
    """The end of an `up` whose trainer exited: the record, the report, then stop `what` unless --keep."""
    state.emit("up_end", status="ok" if code == 0 else "failed", trainer_exit=code)
    if line := status.phases_text(events):
        log(line)
    report(state, events, out)
    if keep:
        log(f"--keep: {what} stays up (grpo-deploy down stops it)")
    else:
        log(f"stopping {what} (the shared storage and its checkpoints are kept)")
        stop()
    if code != 0:
        faults = [e for e in events if e["event"] == "storage_fault"]
        if faults:
            log(f"the trainer stopped on a shared-volume fault ({faults[-1].get('kind')}): "
                f"{status.fault_text(events) or faults[-1].get('message')}")
        log(f"the trainer exited with code {code}: see {state.dir / 'logs.txt'}")
        return 1
    return 0


def report(state: RunState, events: list[dict], out) -> None:
    """The end of an `up`: summary.json, the plot and the summary text, with where each file is."""
    name = state.res.spec.run.name
    summary = summarize(state, events)
    (state.dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2))
    try:
        png = status.plot(events, str(state.dir / f"{name}.png"), title=status.plot_title(name))
    except status.PlotUnavailable as exc:
        png = f"none ({exc})"
    print("\n" + status.summary_text(summary), file=out)
    print(f"\nsummary: {state.dir / 'summary.json'}\nplot:    {png}\nlogs:    {state.dir / 'logs.txt'}", file=out)


def _save_logs(project: compose.Project, state: RunState) -> None:
    proc = project.run("logs", "--no-color", "--timestamps", capture=True, check=False)
    (state.dir / "logs.txt").write_text((proc.stdout or "") + (proc.stderr or ""))


def run_events(state: RunState, live: bool = False) -> list[dict]:
    """The deployer's events plus the trainer's (from the running containers when *live*, else the copy saved at
    the end), limited to the latest `up`: the metrics file appends across resumes."""
    text = fetch_metrics_safe(state.res) if live else None
    if text is None and state.metrics_copy.exists():
        text = state.metrics_copy.read_text()
    events = state.deploy_events() + parse_events(text or "")
    up_start = [e for e in events if e["event"] == "up_start"]
    if up_start:
        events = [e for e in events if e["time"] >= up_start[-1]["time"]]
    return events


def summarize(state: RunState, events: list[dict]) -> status.Summary:
    res = state.res
    return status.summarize(res.spec.run.name, events, max_steps=res.engine_info.total_steps(res))


def host_states(res: Resolved) -> list[dict]:
    """Per role on this host: the container's state, exit code and health (for status), like deploy.host_states."""
    try:
        client = engine.client()
        found = compose.containers(client, res.spec.run.name)
    except engine.DockerUnavailable as exc:
        return [{"host": "local", "role": "-", "state": "no engine", "health": str(exc)}]
    rows = []
    for c in sorted(found, key=lambda c: c.labels.get("com.docker.compose.service", "")):
        st = c.attrs.get("State", {})
        rows.append({"host": "local", "role": c.labels.get("com.docker.compose.service", "-"),
                     "state": state_words(c.status, st.get("ExitCode", 0)),
                     "health": (st.get("Health") or {}).get("Status")})
    return rows or [{"host": "local", "role": "-", "state": "no containers", "health": None}]


def down(res: Resolved, volumes: bool = False) -> None:
    _require_local(res)
    require_kit()
    state = RunState(res)
    if not (state.render_dir / "hosts" / "local.env").exists():
        write_render(state)
    state.project().down(volumes=volumes)


def logs(res: Resolved, roles: list[str] | None = None, follow: bool = False, tail: int = 200) -> int:
    _require_local(res)
    require_kit()
    state = RunState(res)
    if not (state.render_dir / "hosts" / "local.env").exists():
        raise LaunchError(f"no run {res.spec.run.name} was started from this directory ({STATE_DIR}/ is missing)")
    args = ["logs", "--tail", str(tail)] + (["-f"] if follow else []) + list(roles or [])
    return state.project().run(*args, check=False).returncode
