"""The trl-async engine's bring-up on its hosts: the vLLM server (or its replicas, with the replica proxy beside the
trainer) and the trainer started together (the trainer builds its model while the servers load) — or, where they share
a GPU, the server first and the trainer once it is ready (vLLM refuses to start unless gpu_memory_utilization of the
GPU is free, and sizes its KV cache from what it finds) — readiness (every
replica lists the model; one token generated, from the trainer's side), progress per optimizer step until the
trainer exits, the restarts supervision asks for (no server left: trainer stopped, all started again; a dead replica
or proxy: started again alone while the trainer goes on; a trainer over several hosts: every trainer host's container
stopped and started again, machine 0 resolving the resume), and what a failed run leaves to look at (the server's
view of an adapter it could not read)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.common.values import ip_literal, parse_address
from grpo_deploy.deploy import run_view
from grpo_deploy.deploy.bringup.base import POLL_S, STOPPED, container, follow_steps, main_exit
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.deploy.supervise import KILLED, EnginePatience, RoleDied, view_words
from grpo_deploy.engines.trl_async import TRL_ASYNC
from grpo_deploy.engines.trl_replicas import (
    ServerReplica,
    front_services,
    host_services,
    replica_urls,
    server_replicas,
    server_url,
)
from grpo_deploy.engines.trl_trainers import trainer_hosts
from grpo_deploy.hosts import facts as host_facts
from grpo_deploy.hosts import oneoff
from grpo_deploy.hosts.connect import HostError, on_all
from grpo_deploy.names import PROXY_SERVICE, READY_TIMEOUT_S
from grpo_deploy.preflight import cluster as cluster_checks
from grpo_deploy.spec.resolve import Resolved

ENGINE = TRL_ASYNC.name
"""The engine this bring-up serves (grpo_deploy.deploy.bringup.BRINGUP)."""
NOTE_EVERY_S = 15.0  # a line while the server loads
REPLICA = "replica"  # RoleDied's role when some vLLM replicas died and others still serve
PROXY = "proxy"  # RoleDied's role when the replica proxy died (started again alone)


def hosts(dep: Deployment) -> list[str]:
    """The hosts this bring-up starts containers on: every server host, then the trainer's (every trainer host's,
    machine 0 first, when the trainer spans several)."""
    return list(dict.fromkeys([h.name for h in dep.res.hosts_with("server")] + _trainers(dep)))


def _trainers(dep: Deployment) -> list[str]:
    """The trainer hosts, machine 0 first."""
    return [h.name for h in trainer_hosts(dep.res)]


def addresses(dep: Deployment) -> dict[str, str]:
    """Each server host's IP as the trainer's host resolves its address (a name is looked up there): where that
    server publishes its ports ({} when every server shares the trainer's host: loopback); with several trainer
    hosts also each one's address as preflight's cluster check found it (machine 0's is the rendezvous)."""
    out = _server_addresses(dep)
    for name, found in cluster_checks.node_addresses(dep.context).items():
        out.setdefault(name, found.ip)
    return out


def _server_addresses(dep: Deployment) -> dict[str, str]:
    res = dep.res
    trainer = res.host_for("trainer")
    out = {}
    for server in res.hosts_with("server"):
        if trainer is None or server.name == trainer.name or server.publish or server.address == "local":
            continue
        host = parse_address(server.address).host
        literal = ip_literal(host) or host_facts.resolve_ipv4(dep.hosts[trainer.name], host)
        if literal is None:
            raise HostError(trainer.name, f"cannot resolve the server's address {host!r} there",
                            "use an IP address in hosts[].address, or add the name to that host's /etc/hosts")
        out[server.name] = literal
    return out


def addresses_words(ips: dict[str, str]) -> str:
    return f"addresses {ips}" if ips else "the server publishes on loopback (same host)"


def _replicas(dep: Deployment) -> list[ServerReplica]:
    return server_replicas(dep.res)


def _where(replicas: list[ServerReplica]) -> str:
    """The replicas in words: `host` for one, else `host (server, server-2), other (server)`."""
    if len(replicas) == 1:
        return replicas[0].host
    return ", ".join(f"{host} ({', '.join(services)})" for host, services in _by_host(replicas).items())


def _by_host(replicas: list[ServerReplica]) -> dict[str, list[str]]:
    """host -> the compose services of its replicas among *replicas*, in order."""
    out: dict[str, list[str]] = {}
    for r in replicas:
        out.setdefault(r.host, []).append(r.service)
    return out


def _up_servers(dep: Deployment, replicas: list[ServerReplica]) -> None:
    """Start *replicas* with their fronts where they face other hosts (a front still running: compose leaves it),
    one compose call per host."""
    for host, services in _by_host(replicas).items():
        dep.project(host).up(*services, *front_services(dep.res, host, services))


def _up_trainer(dep: Deployment) -> None:
    """The trainer, after the replica proxy when the run has one (its base URL is the proxy); with several trainer
    hosts every other one's trainer as well, all at once (each waits at machine 0's rendezvous)."""
    trainer_host = dep.role_host("trainer")
    dep.project(trainer_host).up(*[s for s in host_services(dep.res, dep.res.host_for("trainer"))
                                   if s in (PROXY_SERVICE, "trainer")])
    others = [dep.hosts[h] for h in _trainers(dep)[1:]]
    for result in on_all(others, lambda conn: dep.project(conn.name).up("trainer")).values():
        if isinstance(result, HostError):
            raise result


def _stop_trainers(dep: Deployment) -> None:
    """The trainer stopped on every trainer host (a survivor of a lost peer may wait in a collective for minutes)."""
    for result in on_all([dep.hosts[h] for h in _trainers(dep)],
                         lambda conn: dep.project(conn.name).compose("stop", "trainer")).values():
        if isinstance(result, HostError):
            raise result


def shared_gpu(res: Resolved) -> str:
    """Where a server and the trainer share a GPU ("host h GPU 0"), or "" when none does: there the server starts
    first."""
    for host in res.spec.hosts:
        if ids := TRL_ASYNC.shared_gpus(res, host):
            return f"host {host.name} GPU {','.join(map(str, ids))}"
    return ""


def start(dep: Deployment, log: Callable[[str], None], ips: dict[str, str], since: float) -> None:
    """Start the server and the trainer (`--no-deps`: compose would otherwise hold the trainer until the server is
    healthy, +15 s to the first step), then wait for readiness — the gate: if it fails, `up` rolls both back. On a
    shared GPU the trainer starts only once the server is ready (shared_gpu)."""
    replicas, trainer_host = _replicas(dep), dep.role_host("trainer")
    what = "the vLLM server" if len(replicas) == 1 else f"{len(replicas)} vLLM server replicas"
    proxy = " behind the replica proxy beside the trainer" if len(replicas) > 1 else ""
    trainers = _trainers(dep)
    where = trainer_host if len(trainers) == 1 else f"{', '.join(trainers)} (one process group; machine 0 on " \
        f"{trainer_host})"
    shared = shared_gpu(dep.res)
    if shared:
        log(f"starting {what} on {_where(replicas)}{proxy}, then the trainer on {where} once it is ready (they share "
            f"{shared}: vLLM needs its gpu_memory_utilization of the GPU free when it starts)")
    else:
        log(f"starting {what} on {_where(replicas)}{proxy} and the trainer on {where} (the trainer builds its model "
            "while the server loads)")
    ready_s = _up_in_order(dep, log, since, replicas, shared)
    remote = [r for r in replicas if r.host != trainer_host]
    if not remote:
        first_completion(dep)
        log(f"{'server' if len(replicas) == 1 else 'every replica'} ready in {ready_s:.1f} s (served model listed in "
            "/v1/models); progress per optimizer step:")
    else:
        log(f"{'server' if len(replicas) == 1 else 'every replica'} ready in {ready_s:.1f} s; from {trainer_host}: "
            f"{check_from_trainer(dep, ips, remote)}; progress per optimizer step:")


def _up_in_order(dep: Deployment, log: Callable[[str], None], since: float, replicas: list[ServerReplica],
                 shared: str, emit: bool = True) -> float:
    """Start *replicas* and the trainer — the trainer after the servers are ready when they share a GPU, else at
    once — and wait for the servers; their ready time (from *since*). *emit*: the trainer_started and server_ready
    events, in the order they happen (`up`; a restart emits none)."""
    def started() -> None:
        _up_trainer(dep)
        if emit:
            dep.state.emit("trainer_started")

    _up_servers(dep, replicas)
    if not shared:
        started()
    ready_s = wait_server(dep, log, since)
    if emit:
        dep.state.emit("server_ready", seconds=round(ready_s, 2), replicas=len(replicas))
    if shared:
        started()
    return ready_s


def restart(dep: Deployment, log: Callable[[str], None], role: str) -> float:
    """Start again what a dead *role* needs: the trainer alone; a dead replica alone (the others keep serving, the
    proxy gives it the current adapter before routing to it); or (every server died) the trainer stopped and all
    started again (on every trainer host when the trainer spans several). The servers' new ready time."""
    if role == "trainer" and len(_trainers(dep)) > 1:
        log(f"starting the trainer again on {', '.join(_trainers(dep))} (machine 0 resolves the checkpoint to resume)")
        _stop_trainers(dep)
    if role in ("trainer", PROXY):  # the proxy as well: up is a no-op for the one still running
        _up_trainer(dep)
        return 0.0
    restart_at = time.time()
    if role == REPLICA:  # started, not waited for: the trainer goes on with the others; follow says when it is back
        dead = [r for r in _replicas(dep) if _stopped(dep, r)]
        _up_servers(dep, dead)
        dep.returning.update({(r.host, r.service): restart_at for r in dead})
        return 0.0
    _stop_trainers(dep)
    dep.returning.clear()
    ready_s = _up_in_order(dep, log, restart_at, _replicas(dep), shared_gpu(dep.res), emit=False)
    log(f"server ready again in {ready_s:.1f} s; progress per optimizer step:")
    return ready_s


def after_failure(dep: Deployment) -> None:
    """What a failed run leaves to look at: the server's own view of an adapter it could not read."""
    note_server_view(dep)


def _replica_container(dep: Deployment, r: ServerReplica) -> dict:
    """A replica's container (running or stopped); LaunchError when it is gone."""
    c = dep.project(r.host).service(r.service, strict=True)
    if c is None:
        raise LaunchError(f"the {r.service} container is gone on {r.host}")
    return c


def _stopped(dep: Deployment, r: ServerReplica) -> bool:
    c = dep.project(r.host).service(r.service, strict=True)
    return c is None or c["state"] in STOPPED


def _server_ready(dep: Deployment, replicas: list[ServerReplica] | None = None) -> bool:
    """True once every replica's health check passes (model listed), and its front's where it faces other hosts (the
    model listed through the front); LaunchError when one exited (a front also when it restarts: it refused to
    start), or the trainer exited with an error while the servers were loading (a bad config fails at once, not after
    they are up)."""
    ready = True
    for r in replicas or _replicas(dep):
        c = _replica_container(dep, r)
        name = "the vLLM server" if r.service == "server" else f"vLLM replica {r.service}"
        if c["state"] in STOPPED:
            raise LaunchError(f"{name} exited on {r.host} before it was ready "
                              f"(exit {c['exit_code']}):\n{dep.project(r.host).tail(c['id'])}")
        ready = ready and c["health"] == "healthy"
        for front in front_services(dep.res, r.host, [r.service]):
            f = dep.project(r.host).service(front, strict=True)
            if f is not None and (f["state"] in STOPPED or f["state"] == "restarting"):
                raise LaunchError(f"the front of {name} ({front}) stopped on {r.host} before it was ready "
                                  f"(exit {f['exit_code']}):\n{dep.project(r.host).tail(f['id'])}")
            ready = ready and f is not None and f["health"] == "healthy"
    if ready:
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


def wait_server(dep: Deployment, log: Callable[[str], None], since: float,
                replicas: list[ServerReplica] | None = None) -> float:
    """Seconds from *since* until every replica (or those given) is ready; a line every NOTE_EVERY_S with the
    first server's last log line."""
    patience = EnginePatience("waiting for the server")
    last_note = 0.0
    where = _where(replicas or _replicas(dep))
    while not patience.poll(lambda: _server_ready(dep, replicas), pause_s=POLL_S):
        elapsed = time.time() - since
        if elapsed > READY_TIMEOUT_S:
            raise LaunchError(f"the server was not ready after {READY_TIMEOUT_S} s (model not listed in /v1/models)")
        if elapsed - last_note >= NOTE_EVERY_S:
            with contextlib.suppress(HostError):
                log(f"waiting for the server on {where}: {elapsed:4.0f} s  | {_last_server_line(dep)}")
            last_note = elapsed
        time.sleep(POLL_S)
    return time.time() - since


def _health_argv(res: Resolved, host: str, port: int | None = None) -> list[str]:
    """From the trainer's side: the server (or the proxy) lists the model and generates one token."""
    return ["python3", "-m", "grpo_deploy.runtime.health", "--role", "server", "--host", host,
            "--port", str(port or res.settings.vllm.port), "--model", res.settings.model.served_name, "--complete"]


def check_from_trainer(dep: Deployment, ips: dict[str, str], remote: list[ServerReplica]) -> str:
    """Servers on other hosts than the trainer: from the trainer's host, in a throw-away container of the trainer
    image, each of them lists the model and generates — the gate before any training (a firewall or a wrong
    address fails here)."""
    res = dep.res
    trainer = dep.role_host("trainer")
    said = []
    for r, url in zip(_replicas(dep), replica_urls(res, ips), strict=True):
        if r not in remote:
            continue
        where = urlsplit(url)
        argv = _health_argv(res, where.hostname, where.port)
        done = oneoff.run(dep.hosts[trainer], res.image_for("trainer"), argv, network="bridge", timeout=400,
                          env_file=dep.project(trainer).token_file)  # the run's token: the server's front asks it
        if not done.ok:
            raise LaunchError(f"the trainer's host {trainer} cannot use the server at {url}: {done.line()} (a "
                              "firewall, a wrong hosts[].publish, or the server's address resolving elsewhere there)")
        said.append(done.out.strip().splitlines()[-1] if done.out.strip() else "ok")
    return said[0] if len(said) == 1 else f"{len(said)} replicas generate ({said[-1]})"


def first_completion(dep: Deployment) -> threading.Thread:
    """Server and trainer on one host: a 1-token completion from inside the trainer's container, in the background
    (a `server_first_completion` event): proves the server generates and warms its first-request paths while the
    trainer spawns its rollout worker (the first generation on a cold CPU server took ~18 s, later ones ~0.1 s)."""
    project = dep.role_project("trainer")

    def run() -> None:
        start = time.time()
        c = project.container("trainer")
        host = urlsplit(server_url(dep.res)).hostname  # the one server, or the proxy in front of the replicas
        r = project.host.run(["docker", "exec", c["id"], *_health_argv(dep.res, host)], timeout=300) if c else None
        ok = r is not None and r.ok
        said = {} if ok else {"error": (r.line() if r is not None else "no trainer container")[:200]}
        dep.state.emit("server_first_completion", ok=not said, seconds=round(time.time() - start, 2), **said)

    thread = threading.Thread(target=run, name="first-completion", daemon=True)
    thread.start()
    return thread


@dataclass
class Servers:
    """What follow reads of the serving side each poll: each replica's container (None: gone), whether it was
    restarted and is not ready yet, and the replica proxy's container (None: none expected or gone)."""

    replicas: list[dict | None]
    returning: list[bool]
    proxy: dict | None = None
    proxy_expected: bool = False
    machines: dict[str, dict | None] = field(default_factory=dict)
    """The trainer's container on every trainer host but machine 0's (None: gone), when the trainer spans hosts."""


def _snapshot(dep: Deployment) -> tuple[dict, str, Servers]:
    """The trainer's container, its metrics text and the serving side, read once."""
    trainer = dep.role_project("trainer")
    c = container(trainer, "trainer")
    text = trainer.read(c["id"], f"{dep.res.run_dir}/metrics.jsonl") or ""
    replicas = _replicas(dep)
    many = len(replicas) > 1
    return c, text, Servers([dep.project(r.host).service(r.service, strict=True) for r in replicas],
                            [(r.host, r.service) in dep.returning for r in replicas],
                            trainer.service(PROXY_SERVICE, strict=True) if many else None, many,
                            {h: dep.project(h).service("trainer", strict=True) for h in _trainers(dep)[1:]})


def _judge(c: dict, servers: Servers, last_step: int) -> int | None:
    """The trainer's exit code once it stopped; RoleDied while the trainer has not finished cleanly: "server" when
    no replica is left serving (every one exited, or the rest are restarting: the trainer is restarted with them),
    REPLICA when some exited and another serves (they are restarted alone), PROXY when the replica proxy exited,
    "trainer" when it is killed — on any of its hosts (a peer's death ends the others' ranks with an error, so a
    kill anywhere is a restart of them all)."""
    trainer_done = c["state"] in STOPPED and int(c["exit_code"] or 0) == 0
    for rank, (host, m) in enumerate(servers.machines.items(), start=1):
        if not trainer_done and (m is None or m["state"] in STOPPED and int(m["exit_code"] or 0) == KILLED):
            raise RoleDied("trainer", KILLED, last_step, where=f"on {host} (machine {rank} of "
                                                               f"{len(servers.machines) + 1})")
    if not trainer_done:
        up = [s is not None and s["state"] not in STOPPED for s in servers.replicas]
        dead = [s for s, alive in zip(servers.replicas, up, strict=True) if not alive]
        if dead:
            code = int(dead[0]["exit_code"] or 1) if dead[0] else -1
            serving = any(alive and not back for alive, back in zip(up, servers.returning, strict=True))
            raise RoleDied(REPLICA if serving else "server", code, last_step)
        proxy = servers.proxy
        if servers.proxy_expected and (proxy is None or proxy["state"] in STOPPED):
            raise RoleDied(PROXY, int(proxy["exit_code"] or 1) if proxy else -1, last_step)
    return main_exit(c, last_step)


def follow(dep: Deployment, log: Callable[[str], None], since: float) -> int:
    """Progress per step until the trainer exits (its exit code); RoleDied (see _judge) for supervision; a line
    (and a `replica_ready` event) when a restarted replica is ready again."""

    def judge(c: dict, servers: Servers, last_step: int) -> int | None:
        for r, s in zip(_replicas(dep), servers.replicas, strict=True):
            started = dep.returning.get((r.host, r.service))
            if started is not None and s is not None and s["health"] == "healthy":
                del dep.returning[(r.host, r.service)]
                seconds = round(time.time() - started, 1)
                dep.state.emit("replica_ready", host=r.host, service=r.service, seconds=seconds, step=last_step)
                log(f"replica {r.service} on {r.host} ready again after {seconds:.0f} s; the proxy gives it the "
                    "current adapter before routing to it")
        return _judge(c, servers, last_step)

    return follow_steps(dep, log, since, "the trainer", lambda: _snapshot(dep), judge)


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
                         "grpo_deploy.runtime.storage.faults", "view", "--", path], timeout=120)
    seen = json.loads(r.out.strip().splitlines()[-1]) if r.ok and r.out.strip() else None
    if seen:
        state.emit("server_view", path=path, words=view_words(seen), uid=seen.get("uid"), gid=seen.get("gid"))
