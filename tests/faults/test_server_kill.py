"""Fault: the vLLM server is killed (SIGKILL) in the middle of a run. `status` must show it within seconds; `up`
restarts the server and the trainer, which resumes from its newest complete checkpoint; the run ends with every step
done and no more lost than one checkpoint interval."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests import compose
from tests.faults.conftest import MAX_STEPS, RUN, SAVE_EVERY
from tests.faults.running import cli, resumed_after_kill, up_with_fault

KILL_AT_STEP = 6  # saves at 4, 8, 12, 16: the kill lands two steps past a checkpoint


def second_up(run: dict, cwd) -> dict:
    """Another `up` of the same run while it trains: from *cwd* (the run's folder, or another one)."""
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "up", "-f", str(run["spec"])], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    return {"code": proc.returncode, "line": errors[0] if len(errors) == 1 else proc.stderr[-2000:],
            "seconds": time.time() - began, "traceback": "Traceback" in proc.stderr + proc.stdout}


def test_server_killed_mid_run_is_restarted_and_the_trainer_resumes(fault_run, cpu_image, docker_client, fault_row,
                                                                      another_fault_row):
    another_fault_row.update(fault="a second `up` of the live run (while it restarts its server), from its folder "
                                   "and from another folder (local)",
                             expected="each refused at once in one line naming the first `up`, exit 2; nothing "
                                      "started; the live run unaffected")
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
        # While the first `up` restarts the server: two more `up`s of the run (a user who thinks it hung).
        other = fault_run["cwd"] / "another-folder"
        other.mkdir()
        killed["second"] = [second_up(fault_run, fault_run["cwd"]), second_up(fault_run, other)]

    code, output = up_with_fault(fault_run, KILL_AT_STEP, kill_server)
    same, elsewhere = killed["second"]
    assert same["code"] == 2 and not same["traceback"], same
    assert "already being started from this folder (`grpo-deploy up` in" in same["line"], same
    assert elsewhere["code"] == 2 and not elsewhere["traceback"], elsewhere
    assert "already being started from another folder (`grpo-deploy up` in" in elsewhere["line"], elsewhere
    assert not (fault_run["cwd"] / "another-folder" / ".grpo-deploy" / RUN / "render").exists()
    assert "exited" in killed["status"] and "137" in killed["status"], killed
    assert killed["status_s"] < 15, killed
    assert code == 0, output[-4000:]
    assert "restarting the server and the trainer" in output and "server ready again" in output, output[-3000:]
    got = resumed_after_kill((fault_run["state"] / "metrics.jsonl").read_text(), killed, MAX_STEPS, SAVE_EVERY)
    another_fault_row.update(observed=f"refused after {same['seconds']:.1f} s (same folder) and "
                                      f"{elsewhere['seconds']:.1f} s (another folder), exit 2, one line each; "
                                      "nothing rendered in the other folder; the live run restarted once (its own "
                                      f"restart) and reached {got['last_step']}/{MAX_STEPS}",
                             **{"steps lost": 0, "data lost": "none"})
    fault_row.update(observed=f"status after {killed['status_s']:.1f} s: {killed['status']}; resumed from "
                              f"checkpoint-{got['resumed']}; {got['loads_after']} adapter loads after the restart, "
                              f"all OK; {got['last_step']}/{MAX_STEPS} steps",
                     **{"steps lost": got["lost"], "data lost": "none"})
