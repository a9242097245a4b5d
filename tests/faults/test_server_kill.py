"""Fault: the vLLM server is killed (SIGKILL) in the middle of a run. `status` must show it within seconds; `up`
restarts the server and the trainer, which resumes from its newest complete checkpoint; the run ends with every step
done and no more lost than one checkpoint interval."""

from __future__ import annotations

import json
import re
import time

from grpo_deploy import compose
from grpo_deploy.runtime.metrics import parse_events

from .conftest import MAX_STEPS, RUN, SAVE_EVERY
from .running import cli, up_with_fault

KILL_AT_STEP = 6  # saves at 4, 8, 12, 16: the kill lands two steps past a checkpoint


def test_server_killed_mid_run_is_restarted_and_the_trainer_resumes(fault_run, cpu_image, docker_client, fault_row):
    fault_row.update(fault=f"vLLM server SIGKILL at step {KILL_AT_STEP} of {MAX_STEPS} (local)",
                     expected=f"status shows it within 15 s; server + trainer restarted; resume from the newest "
                              f"complete checkpoint; <= {SAVE_EVERY} steps lost")
    killed = {}

    def kill_server(step: int) -> None:
        (server,) = compose.containers(docker_client, RUN, "server")
        server.kill()  # SIGKILL, as the kernel's OOM killer or `docker kill` would
        killed.update(step=step, time=time.time())
        status = cli(fault_run, "status", "--json", timeout=120)
        hosts = json.loads(status.stdout).get("hosts", []) if status.returncode == 0 else []
        killed["status"] = " ".join(f"{h['state']}/{h['health']}" for h in hosts if h["role"] == "server")
        killed["status_s"] = time.time() - killed["time"]

    code, output = up_with_fault(fault_run, KILL_AT_STEP, kill_server)
    assert "exited" in killed["status"] and "137" in killed["status"], killed
    assert killed["status_s"] < 15, killed
    assert code == 0, output[-4000:]
    assert "restarting the server and the trainer" in output and "server ready again" in output, output[-3000:]
    events = parse_events((fault_run["state"] / "metrics.jsonl").read_text())
    starts = [e for e in events if e["event"] == "run_start"]
    m = re.search(r"checkpoint-(\d+)$", starts[-1].get("resumed_from") or "")
    assert len(starts) == 2 and m, [e.get("resumed_from") for e in starts]
    resumed_step = int(m.group(1))
    lost = killed["step"] - resumed_step
    assert 0 <= lost <= SAVE_EVERY, (killed["step"], resumed_step)
    steps = sorted({int(e["step"]) for e in events if e["event"] == "step"})
    assert steps[-1] == MAX_STEPS
    after = [e for e in events if e["event"] == "adapter_load" and e["time"] > killed["time"] + 5]
    assert after and all(e["ok"] for e in after), [e.get("error") for e in after if not e["ok"]]
    fault_row.update(observed=f"status after {killed['status_s']:.1f} s: {killed['status']}; resumed from "
                              f"checkpoint-{resumed_step}; {len(after)} adapter loads after the restart, all OK; "
                              f"{steps[-1]}/{MAX_STEPS} steps",
                     **{"steps lost": lost, "data lost": "none"})
