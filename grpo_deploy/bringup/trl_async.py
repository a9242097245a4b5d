"""The trl-async engine's bring-up on its hosts: the vLLM server and the trainer started together (the trainer builds
its model while the server loads), readiness (model listed; one token generated, from the trainer's side), progress
per optimizer step until the trainer exits, the restarts supervision asks for (a dead server: trainer stopped, both
started again), and what a failed run leaves to look at (the server's view of an adapter it could not read)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable

from .. import run_view
from ..deployment import Deployment
from ..hosts import facts as host_facts
from ..hosts import oneoff
from ..hosts.connect import HostError
from ..names import READY_TIMEOUT_S
from ..resolve import Resolved
from ..run_state import LaunchError
from ..runtime.metrics import parse_events
from ..runtime.values import ip_literal, parse_address
from ..supervise import EnginePatience, RoleDied, view_words
from . import POLL_S, STOPPED, container, follow_steps, main_exit

NOTE_EVERY_S = 15.0  # a line while the server loads


def hosts(dep: Deployment) -> list[str]:
    """The hosts this bring-up starts containers on."""
    return list(dict.fromkeys((dep.role_host("server"), dep.role_host("trainer"))))


def addresses(dep: Deployment, ctx=None) -> dict[str, str]:
    """The server host's IP as the trainer's host resolves its address (a name is looked up there): where the
    server publishes its port ({} on one host: loopback)."""
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
    ip = host_facts.resolve_ipv4(dep.hosts[trainer.name], host)
    if ip is None:
        raise HostError(trainer.name, f"cannot resolve the server's address {host!r} there",
                        "use an IP address in hosts[].address, or add the name to that host's /etc/hosts")
    return {server.name: ip}


def addresses_words(ips: dict[str, str]) -> str:
    return f"the server publishes on {ips or 'loopback (same host)'}"


def start(dep: Deployment, log: Callable[[str], None], ips: dict[str, str], since: float) -> None:
    """Start the server and the trainer (`--no-deps`: compose would otherwise hold the trainer until the server is
    healthy, +15 s to the first step), then wait for readiness — the gate: if it fails, `up` rolls both back."""
    server_host, trainer_host = dep.role_host("server"), dep.role_host("trainer")
    log(f"starting the vLLM server on {server_host} and the trainer on {trainer_host} (the trainer builds its "
        "model while the server loads)")
    dep.project(server_host).up("server")
    dep.project(trainer_host).up("trainer")
    dep.state.emit("trainer_started")
    ready_s = wait_server(dep, log, since)
    dep.state.emit("server_ready", seconds=round(ready_s, 2))
    if server_host == trainer_host:
        first_completion(dep)
        log(f"server ready in {ready_s:.1f} s (served model listed in /v1/models); progress per optimizer step:")
    else:
        log(f"server ready in {ready_s:.1f} s; from {trainer_host}: {check_from_trainer(dep, ips)}; progress per "
            "optimizer step:")


def restart(dep: Deployment, log: Callable[[str], None], role: str) -> float:
    """Start again what a dead *role* needs: the trainer alone, or (the server died) the trainer stopped and both
    started; the server's new ready time."""
    server_host, trainer_host = dep.role_host("server"), dep.role_host("trainer")
    if role == "trainer":
        dep.project(trainer_host).up("trainer")
        return 0.0
    dep.project(trainer_host).compose("stop", "trainer")
    restart_at = time.time()
    dep.project(server_host).up("server")
    dep.project(trainer_host).up("trainer")
    ready_s = wait_server(dep, log, restart_at)
    log(f"server ready again in {ready_s:.1f} s; progress per optimizer step:")
    return ready_s


def after_failure(dep: Deployment) -> None:
    """What a failed run leaves to look at: the server's own view of an adapter it could not read."""
    note_server_view(dep)


def _server_ready(dep: Deployment) -> bool:
    """True once the server's health check passes (model listed); LaunchError when the server exited, or the trainer
    exited with an error while the server was loading (a bad config fails at once, not after the server is up)."""
    server = dep.role_project("server")
    c = container(server, "server")
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
    c = container(trainer, "trainer")
    text = trainer.read(c["id"], f"{dep.res.run_dir}/metrics.jsonl") or ""
    return c, text, dep.role_project("server").container("server", strict=True)


def _judge(c: dict, server: dict | None, last_step: int) -> int | None:
    """The trainer's exit code once it stopped; RoleDied when the server's container exits while the trainer has
    not finished cleanly, or the trainer is killed."""
    trainer_done = c["state"] in STOPPED and int(c["exit_code"] or 0) == 0
    if (server is None or server["state"] in STOPPED) and not trainer_done:
        raise RoleDied("server", int(server["exit_code"] or 1) if server else -1, last_step)
    return main_exit(c, last_step)


def follow(dep: Deployment, log: Callable[[str], None], since: float) -> int:
    """Progress per step until the trainer exits (its exit code); RoleDied (see _judge) for supervision."""
    return follow_steps(dep, log, since, "the trainer", lambda: _snapshot(dep), _judge)


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
