"""Supervision of a running `up`: a role that died mid-run restarted (at most --restarts times), an engine slow to
answer ridden out, and the end of the run — the record, the report (summary.json, the plot, the summary text) and
the words for container states and exit codes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from grpo_deploy import status
from grpo_deploy.common.term import fit
from grpo_deploy.deploy.run_state import LaunchError, RunState
from grpo_deploy.hosts.connect import HostError

KILLED = 137  # a container's exit code after SIGKILL: `docker kill`, the kernel's OOM killer, a host reboot


class RoleDied(Exception):
    """A role's container exited mid-run in a way a restart recovers from: the server exited while the trainer was
    still training, or the trainer was killed (SIGKILL) — an exception in the trainer (exit 1) is not retried. *where*:
    which of several died, in words (`on spark2 (machine 1 of 2)`), when it matters."""

    def __init__(self, role: str, exit_code: int, step: int, where: str = ""):
        super().__init__(f"{role} exit {exit_code}")
        self.role, self.exit_code, self.step, self.where = role, exit_code, step, where


def exit_words(code: int) -> str:
    return f"code {code}" + (" (SIGKILL: killed, or out of memory)" if code == KILLED else "")


def state_words(state: str, exit_code: int | None) -> str:
    """A container's state for status: its exit code (and what 137 means) once it has stopped."""
    return state + (f" ({exit_words(int(exit_code or 0))})" if state in ("exited", "dead") else "")

ENGINE_STALL_S = 120.0  # how long a busy Docker engine may leave polls unanswered before `up` gives up


class EnginePatience:
    """Rides out a Docker engine that is slow to answer one poll (seen in CI: a 10 s read timeout on a loaded
    2-core machine killed a healthy run); gives up with one line once it has not answered for ENGINE_STALL_S."""

    def __init__(self, what: str, limit_s: float = ENGINE_STALL_S):
        self.what, self.limit_s, self.since = what, limit_s, None

    def transient(self, exc: Exception) -> bool:
        import docker
        import requests

        if isinstance(exc, (HostError, requests.exceptions.Timeout, requests.exceptions.ConnectionError)):
            return True  # HostError: a `docker` command on the host failed or timed out, or its SSH link dropped
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

def supervise(state: RunState, log: Callable[[str], None], since: float, restarts: int,
              follow: Callable[[float], int], restart: Callable[[str], float]) -> int:
    """Follow the trainer to its end (*follow*(since) -> exit code). Each time the server dies mid-run or the trainer
    is killed (SIGKILL, out of memory), *restart*(role) starts what is needed again — for the server: the trainer
    stopped, both started, the server's new ready time returned — and the trainer resumes from its newest complete
    checkpoint (the half-written one quarantined); a vLLM replica or the replica proxy is started again alone while
    the trainer goes on. At most *restarts* times in all, then the run fails in one line. The engine names its roles
    (Engine.restart_words)."""
    words = state.res.engine_info.restart_words
    used = 0
    while True:
        try:
            return follow(since)
        except RoleDied as died:
            what = words.died.get(died.role, "the trainer")
            what += f" {died.where}" if died.where else ""
            if used >= restarts:
                role = words.logs_role.get(died.role, died.role)
                raise LaunchError(f"{what} exited with {exit_words(died.exit_code)} at step {died.step}; "
                                  f"{restarts} restart(s) allowed (--restarts) are used up; its last lines: "
                                  f"grpo-deploy logs --role {role}") from None
            used += 1
            state.emit("role_died", role=died.role, exit_code=died.exit_code, step=died.step, restart=used,
                       **({"where": died.where} if died.where else {}))
            again = words.again.get(died.role, "the trainer")
            if died.role in words.alone:
                others = words.alone[died.role]
                log(f"{what} exited with {exit_words(died.exit_code)} at step {died.step}: restarting it; the trainer "
                    f"goes on{others} (restart {used} of {restarts})")
            else:
                log(f"{what} exited with {exit_words(died.exit_code)} at step {died.step}: restarting {again}; the "
                    f"trainer resumes from its newest complete checkpoint (restart {used} of {restarts})")
            since = time.time()  # the steps before were printed (those of a resumed trainer, or of one going on)
            ready_s = restart(died.role)
            state.emit("role_restarted", role=died.role, seconds=round(ready_s, 2), restart=used)

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
        ends = [e for e in events if e["event"] == "run_end"]
        stops = [e for e in events if e["event"] == "disk_watchdog_stop"]
        if stops and ends and ends[-1].get("status") == "disk-full":  # the watchdog's own line: what to free
            log(stops[-1].get("message") or "the disk watchdog stopped the trainer before a save that would not fit")
        log(f"the trainer exited with code {code}: see {state.dir / 'logs.txt'}")
        return 1
    ends = [e for e in events if e["event"] == "run_end"]
    if ends and ends[-1].get("status") == status.STOPPED_EARLY:
        log(f"stopped early: {status.one_line(ends[-1].get('error'))}. To train on, `grpo-deploy up` resumes from "
            "that checkpoint (the watcher judges the steps after it afresh); watch.action: warn only warns")
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
    print("\n" + fit(status.summary_text(summary), out), file=out)  # a label's value wraps under its column
    print(f"\nsummary: {state.dir / 'summary.json'}\nplot:    {png}\nlogs:    {state.dir / 'logs.txt'}", file=out)

def summarize(state: RunState, events: list[dict]) -> status.Summary:
    res = state.res
    return status.summarize(res.spec.run.name, events, max_steps=res.engine_info.total_steps(res),
                            watch=res.engine_info.watch(res))

def view_words(seen: dict) -> str:
    """storage_faults.PathView.words() for the JSON the server container printed."""
    from grpo_deploy.runtime.storage.faults import PathView

    return PathView(**{k: seen.get(k) for k in ("path", "blocked", "problem", "mode", "owner")}).words()
