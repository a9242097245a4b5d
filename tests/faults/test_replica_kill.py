"""Fault: one of two vLLM server replicas (behind the kit's replica proxy, both on this machine) is killed (SIGKILL) in
the middle of a run. The trainer must go on with the other replica, without a restart of its own; `up` starts the
dead replica again; the proxy gives it the current adapter before routing to it; every adapter load succeeds on
every replica that is up, no completion reaches a replica that lacks its adapter, and the reward rises."""

from __future__ import annotations

import json
import re
import time

import yaml

from grpo_deploy.common.metrics import parse_events
from tests import compose
from tests.faults.conftest import MAX_STEPS, RUN
from tests.faults.running import up_with_fault

KILL_AT_STEP = 6
RETURN_WAIT_S = 600  # the replica's own start on a loaded 2-core machine took 218 s


def _stats(docker_client) -> dict:
    """The proxy's /proxy/stats, asked from inside its container (it is published nowhere), with the run's token from
    the container's environment (the proxy asks for it when it has one)."""
    (proxy,) = compose.containers(docker_client, RUN, "proxy")
    code, out = proxy.exec_run(["python3", "-c", compose.PROXY_STATS])
    assert code == 0, out
    return json.loads(out)


def _listed(container) -> set[str]:
    code, out = container.exec_run(["python3", "-c", "import json, urllib.request; print(json.dumps([m['id'] for m "
                                    "in json.load(urllib.request.urlopen('http://127.0.0.1:8000/v1/models', "
                                    "timeout=10))['data']]))"])
    assert code == 0, out
    return set(json.loads(out))


def test_a_killed_replica_is_restarted_alone_and_given_the_current_adapter(fault_run, cpu_image, docker_client,
                                                                           fault_row):
    fault_row.update(fault=f"one of 2 vLLM replicas SIGKILLed at step {KILL_AT_STEP} of {MAX_STEPS} (local, "
                           "behind the replica proxy)",
                     expected="the trainer goes on with the other replica (no trainer restart); the replica "
                              "restarted alone and given the current adapter before it is routed to; every load OK")
    data = yaml.safe_load(fault_run["spec"].read_text())
    data["hosts"][0]["replicas"] = 2
    fault_run["spec"].write_text(yaml.safe_dump(data, sort_keys=False))
    killed = {}

    def kill_replica(step: int) -> None:
        (replica,) = compose.containers(docker_client, RUN, "server-2")
        replica.kill()  # SIGKILL
        killed.update(step=step, time=time.time())

    code, output = up_with_fault(fault_run, KILL_AT_STEP, kill_replica)
    assert code == 0, output[-4000:]
    assert "starting 2 vLLM server replicas on local (server, server-2) behind the replica proxy" in output
    assert "a vLLM server replica exited with code 137" in output and "restarting it; the trainer goes on" in output

    # The run kept going: one trainer start, every step, reward up, every load OK.
    events = parse_events((fault_run["state"] / "metrics.jsonl").read_text())
    assert len([e for e in events if e["event"] == "run_start"]) == 1, "the trainer was restarted"
    steps = [e for e in events if e["event"] == "step"]
    assert sorted({int(e["step"]) for e in steps})[-1] == MAX_STEPS
    during = [e for e in steps if killed["time"] < e["time"]]
    assert during, "no step was trained after the kill"
    rewards = [float(e["reward"]) for e in steps]
    # The rise the other fault runs ask for: a margin over 16 noisy steps failed CI once (0.19 vs 0.14 + 0.1) on a
    # run that was otherwise sound; the rehearsal's 40 steps keep the +0.1 margin (tests/integration).
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4, rewards
    loads = [e for e in events if e["event"] == "adapter_load"]
    assert loads and all(e["ok"] for e in loads), [e.get("error") for e in loads if not e["ok"]]

    # The replica returns (`up --keep` left the run up) with every adapter the proxy holds, and is routed to again.
    deadline = time.time() + RETURN_WAIT_S
    stats = _stats(docker_client)
    while not all(r["healthy"] for r in stats["replicas"]):
        assert time.time() < deadline, f"server-2 not back within {RETURN_WAIT_S} s: {stats['replicas']}"
        time.sleep(5)
        stats = _stats(docker_client)
    back = stats["replicas"][1]
    assert back["url"] == "http://server-2:8000" and back["resyncs"] >= 2, back  # its first start, then its return
    assert all(r["loads_failed"] == 0 for r in stats["replicas"]), stats["replicas"]
    current = set(stats["adapters"])
    (second,) = compose.containers(docker_client, RUN, "server-2")
    assert current and current <= _listed(second), (current, _listed(second))
    # No completion reached a replica without its adapter: vLLM answers such a request 404 ("does not exist").
    for name in ("server", "server-2"):
        (c,) = compose.containers(docker_client, RUN, name)
        logs = c.logs().decode(errors="replace")
        assert not re.search(r'"POST /v1/(chat/)?completions HTTP/1\.1" 404', logs), f"{name} answered 404"
    (proxy,) = compose.containers(docker_client, RUN, "proxy")
    proxy_log = proxy.logs().decode(errors="replace")
    assert "is up; adapters given: trl-policy-v" in proxy_log, proxy_log[-2000:]
    routing = stats["routing"]
    print(f"replica kill: affinity share {routing['affinity_share']}, spills {routing['spills']}; loads per replica "
          + ", ".join(f"{r['url']} {r['loads_ok']} ok / {r['loads_failed']} failed, resyncs {r['resyncs']}"
                      for r in stats["replicas"]))
    fault_row.update(observed=f"{len(during)} steps trained after the kill without a trainer restart; "
                              f"server-2 back and resynced ({back['resyncs'] - 1} time(s)), given "
                              f"{len(current)} current adapter(s); loads per replica "
                              f"{[r['loads_ok'] for r in stats['replicas']]}, 0 failed; affinity "
                              f"{routing['affinity_share']}; {MAX_STEPS}/{MAX_STEPS} steps",
                     **{"steps lost": 0, "data lost": "none"})
