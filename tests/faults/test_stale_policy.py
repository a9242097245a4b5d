"""Fault: the server keeps serving the base model. Mid-run, the replica proxy's `serve-base-model` failpoint
(runtime/serving/failpoint.py) is armed on the share: from then on every adapter load is answered 200 without
reaching a vLLM server, completions naming the newest adapter are served by the base model, and the model list still
names the adapter (the failpoint's default: only the probe can tell). Nothing crashes; the rollouts come from the
initial policy, the run is wasted (the field cases: an adapter never synced under async + LoRA, an evicted adapter, a
stale prefix cache under a reused adapter name).

The kit must catch it with its served-policy check (runtime/trainer/served_policy.py: after each load, the probe's
logprobs under the adapter against the base model's) and, with `watch.action: stop`, save and stop the run: `up`
exits 0 with the one `run watcher: stale policy: ...` line and `stopped early`, within STOP_WITHIN steps of the
failpoint (docs/operations/watcher.md states the bound: three checked syncs after the first swallowed load, the
check's own thread and the proxy's one-second look-up of the file as the margin).

Shape, chosen for CI time: the cpu rehearsal on this machine with 2 server replicas (the proxy is only in the path
with more than one: the second vLLM CPU server is the cost), the fault run's 16 steps of which about 12 are trained
before the stop. Expect about 4-6 minutes on 2 cores (as test_replica_kill.py, less the replica's restart)."""

from __future__ import annotations

import time

import yaml

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.hosts import oneoff
from grpo_deploy.hosts.connect import LocalHost
from grpo_deploy.runtime.serving.failpoint import FAILPOINT_DIR, SERVE_BASE_MODEL
from grpo_deploy.runtime.trainer import served_policy
from tests.faults.conftest import MAX_STEPS
from tests.faults.running import up_with_fault

ARM_AT = 5  # adapters v1-v4 are served for real first: the check sees the server apply adapters (its firm rule)
STOP_WITHIN = served_policy.AFTER + 5  # steps from the file's planting to the run's stop (see the docstring)


def test_a_server_serving_the_base_model_is_caught_and_the_run_stops(fault_run, cpu_image, fault_row):
    fault_row.update(fault=f"adapter loads acknowledged but never applied from step {ARM_AT} (the replica proxy's "
                           "serve-base-model failpoint: loads swallowed, completions served by the base model, the "
                           "model list still naming the adapter)",
                     expected=f"the served-policy check finds the base model's answers under the newest adapter; "
                              f"watch.action: stop saves and stops within {STOP_WITHIN} steps, one line in `up`")
    data = yaml.safe_load(fault_run["spec"].read_text())
    data["hosts"][0]["replicas"] = 2
    data["watch"] = {**(data.get("watch") or {}), "action": "stop"}
    fault_run["spec"].write_text(yaml.safe_dump(data, sort_keys=False))
    res = fault_run["res"]
    armed = {}

    def serve_base_model(step: int) -> None:
        armed.update(time=time.time())
        flag_dir = f"{res.checkpoint_dir}/{FAILPOINT_DIR}"
        done = oneoff.run(LocalHost(), res.image_for("trainer"),
                          ["sh", "-c", f"mkdir -p {flag_dir} && : > {flag_dir}/{SERVE_BASE_MODEL}"],
                          ident=res.identities["trainer"], share=(res, None))
        assert done.ok, done.out + done.err
        armed.update(step=step)

    code, output = up_with_fault(fault_run, ARM_AT, serve_base_model)
    assert code == 0, output[-4000:]
    assert "behind the replica proxy" in output, output[-3000:]
    lines = [line for line in output.splitlines() if "run watcher: stale policy: " in line]
    assert len(lines) == 1 and "stopped early: run watcher: stale policy: " in output, output[-4000:]
    assert "acknowledged but not applied" in lines[0] and "trl-policy-v" in lines[0], lines

    events = parse_events((fault_run["state"] / "metrics.jsonl").read_text())
    ends = [e for e in events if e["event"] == "run_end"]
    assert ends[-1]["status"] == "stopped-early", ends
    stopped = int(ends[-1]["steps"])
    (found,) = [e for e in events if e["event"] == "watch" and e.get("kind") == "stale_policy"]
    assert found["level"] == "stop" and found["verdict"] == "base", found
    checks = [e for e in events if e["event"] == "served_policy"]
    before = [e for e in checks if e["time"] < armed["time"]]  # a check after it reads the base, whatever version
    assert before and all(e["verdict"] in ("applied", "early") for e in before), before
    assert any(e["verdict"] == "applied" for e in before), before  # the server applied adapters before the fault
    # the failpoint lists what it swallowed: the probe, not the list, caught it
    assert all(e["listed"] is not False for e in checks), checks
    assert stopped - armed["step"] <= STOP_WITHIN and stopped < MAX_STEPS, (armed, stopped, checks)
    steps = sorted({int(e["step"]) for e in events if e["event"] == "step"})
    assert steps[-1] == stopped
    fault_row.update(observed=f"armed at step {armed['step']}; {found['adapter']} answered as the base "
                              f"(max |diff| {found['max_abs_diff']}, threshold {found['threshold']:.3g}); saved and "
                              f"stopped at step {stopped}, `up` exit 0 with one line",
                     **{"steps lost": stopped - armed["step"], "data lost": "none"})
