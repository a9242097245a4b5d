"""Two faults in one local run (the cpu rehearsal as run `faults`, a trainer of two processes: FSDP2 over gloo,
sharded checkpoints; 16 steps, a save every 4).

1. The vLLM server is killed (SIGKILL) at step 6. `status` must show it within seconds; two more `up`s of the live run
   (from its folder and from another) are refused at once in one line each; `up` restarts the server and the trainer,
   which resumes from its newest complete checkpoint, no more than one interval lost.
2. After that restart, the trainer is killed in the middle of a real checkpoint save — held there by the runtime's
   `pause-mid-save` failpoint on rank 0 after both ranks' weight and optimizer shards are written and before
   `trainer_state.json`. `up` restarts the trainer, whose launcher quarantines the half-written checkpoint (never
   deletes it) and resumes both ranks from the newest complete one.

The run ends with every step done and the reward risen; then the same run with one trainer process is refused in one
line: its checkpoints hold two ranks. (These were two runs, one per fault, of about 4.5 and 3.5 minutes; one run
carries every check of both, and pays one start-up fewer.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import yaml

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.hosts import oneoff
from grpo_deploy.hosts.connect import LocalHost
from grpo_deploy.runtime.trainer.trl_hooks import FAILPOINT_DIR, PAUSE_MID_SAVE
from tests import compose
from tests.faults.conftest import MAX_STEPS, RUN, SAVE_EVERY
from tests.faults.running import cli, resumed_after_kill, up_with_faults

KILL_SERVER_AT = 6  # saves at 4, 8, 12, 16: the kill lands two steps past a checkpoint
ARM_AT = 9  # after the restart: the pause holds the save of step 12, the newest complete one is 8


def second_up(run: dict, cwd) -> dict:
    """Another `up` of the same run while it trains: from *cwd* (the run's folder, or another one)."""
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "up", "-f", str(run["spec"])], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    return {"code": proc.returncode, "line": errors[0] if len(errors) == 1 else proc.stderr[-2000:],
            "seconds": time.time() - began, "traceback": "Traceback" in proc.stderr + proc.stdout}


def _events(docker_client, res) -> list[dict]:
    (trainer,) = compose.containers(docker_client, RUN, "trainer")
    return parse_events(compose.read_file(trainer, f"{res.run_dir}/metrics.jsonl") or "")


def test_server_then_trainer_killed_mid_save_both_resume(two_process_run, cpu_image, docker_client, fault_row,
                                                         another_fault_row, third_fault_row):
    run, res = two_process_run, two_process_run["res"]
    fault_row.update(fault=f"vLLM server SIGKILL at step {KILL_SERVER_AT} of {MAX_STEPS} (local)",
                     expected=f"status shows it within 15 s; server + trainer restarted; resume from the newest "
                              f"complete checkpoint; <= {SAVE_EVERY} steps lost")
    another_fault_row.update(fault="a second `up` of the live run (while it restarts its server), from its folder "
                                   "and from another folder (local)",
                             expected="each refused at once in one line naming the first `up`, exit 2; nothing "
                                      "started; the live run unaffected")
    third_fault_row.update(fault="trainer of 2 processes (FSDP2) SIGKILLed in the middle of a sharded checkpoint "
                                 "save, after a server restart (local)",
                           expected="half-written checkpoint quarantined, not deleted; trainer restarted, both ranks "
                                    f"resume from the newest complete one; <= {SAVE_EVERY} steps lost; 1 process "
                                    "then refused")
    server_killed, trainer_killed = {}, {}

    def kill_server(step: int) -> None:
        (server,) = compose.containers(docker_client, RUN, "server")
        server.kill()  # SIGKILL, as the kernel's OOM killer or `docker kill` would
        server_killed.update(step=step, time=time.time())
        status = cli(run, "status", "--json", timeout=120)
        hosts = json.loads(status.stdout).get("hosts", []) if status.returncode == 0 else []
        server_killed["status"] = " ".join(f"{h['state']}/{h['health']}" for h in hosts if h["role"] == "server")
        server_killed["status_s"] = time.time() - server_killed["time"]
        # While the first `up` restarts the server: two more `up`s of the run (a user who thinks it hung).
        other = run["cwd"] / "another-folder"
        other.mkdir()
        server_killed["second"] = [second_up(run, run["cwd"]), second_up(run, other)]

    def arm_and_kill_trainer(step: int) -> None:
        deadline = time.time() + 600
        # the trainer may go on a few steps on rollouts it holds before the restart: arm it in the restarted run
        while time.time() < deadline and len([e for e in _events(docker_client, res) if e["event"] == "run_start"]) < 2:
            time.sleep(0.5)
        flag_dir = f"{res.checkpoint_dir}/{FAILPOINT_DIR}"
        armed = oneoff.run(LocalHost(), res.images["trainer"],
                           ["sh", "-c", f"mkdir -p {flag_dir} && echo 300 > {flag_dir}/{PAUSE_MID_SAVE}"],
                           ident=res.identities["trainer"], share=(res, None))
        assert armed.ok, armed.out + armed.err
        while time.time() < deadline and not trainer_killed:
            events = _events(docker_client, res)
            paused = [e for e in events if e["event"] == "failpoint" and e.get("name") == PAUSE_MID_SAVE]
            if paused:
                (trainer,) = compose.containers(docker_client, RUN, "trainer")
                trainer.kill()
                trainer_killed.update(checkpoint=paused[-1]["checkpoint"], time=time.time(),
                                      step=max(int(e["step"]) for e in events if e["event"] == "step"))
            time.sleep(0.5)

    code, output = up_with_faults(run, [(KILL_SERVER_AT, kill_server), (ARM_AT, arm_and_kill_trainer)])
    assert code == 0, output[-4000:]
    metrics = (run["state"] / "metrics.jsonl").read_text()
    events = parse_events(metrics)

    # 1. the server kill
    same, elsewhere = server_killed["second"]
    assert same["code"] == 2 and not same["traceback"], same
    assert "already being started from this folder (`grpo-deploy up` in" in same["line"], same
    assert elsewhere["code"] == 2 and not elsewhere["traceback"], elsewhere
    assert "already being started from another folder (`grpo-deploy up` in" in elsewhere["line"], elsewhere
    assert not (run["cwd"] / "another-folder" / ".grpo-deploy" / RUN / "render").exists()
    assert "exited" in server_killed["status"] and "137" in server_killed["status"], server_killed
    assert server_killed["status_s"] < 15, server_killed
    assert "restarting the server and the trainer" in output and "server ready again" in output, output[-3000:]
    got = resumed_after_kill(metrics, server_killed, MAX_STEPS, SAVE_EVERY, restarts=2)
    another_fault_row.update(observed=f"refused after {same['seconds']:.1f} s (same folder) and "
                                      f"{elsewhere['seconds']:.1f} s (another folder), exit 2, one line each; "
                                      "nothing rendered in the other folder; the live run restarted (its own "
                                      f"restarts) and reached {got['last_step']}/{MAX_STEPS}",
                             **{"steps lost": 0, "data lost": "none"})
    fault_row.update(observed=f"status after {server_killed['status_s']:.1f} s: {server_killed['status']}; resumed "
                              f"from checkpoint-{got['resumed']}; {got['loads_after']} adapter loads after the "
                              f"restart, all OK; {got['last_step']}/{MAX_STEPS} steps",
                     **{"steps lost": got["lost"], "data lost": "none"})

    # 2. the trainer killed mid-save
    assert trainer_killed, "the trainer never paused in its save:\n" + output[-3000:]
    assert "the trainer exited with code 137" in output and "restarting the trainer;" in output, output[-3000:]
    quarantined = [e for e in events if e["event"] == "checkpoint_quarantine"]
    assert [e["path"] for e in quarantined] == [trainer_killed["checkpoint"]], quarantined
    assert "/quarantine/" in quarantined[0]["moved_to"] and "half-written" in quarantined[0]["reason"]
    starts = [e for e in events if e["event"] == "run_start"]
    m = re.search(r"checkpoint-(\d+)$", starts[-1].get("resumed_from") or "")
    assert m and starts[-1]["time"] > trainer_killed["time"], [e.get("resumed_from") for e in starts]
    resumed_step = int(m.group(1))
    lost = trainer_killed["step"] - resumed_step
    assert 0 < lost <= SAVE_EVERY, (trainer_killed["step"], resumed_step)
    assert max(int(e["step"]) for e in events if e["event"] == "step") == MAX_STEPS
    listed = cli(run, "checkpoints", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    listing = json.loads(listed.stdout)["checkpoints"]
    complete = [c["step"] for c in listing if c["state"] == "complete"]
    assert complete[-1] == MAX_STEPS, complete
    assert {c["world_size"] for c in listing if c["state"] == "complete"} == {2}, listing
    restarted = next(e["time"] for e in starts if e["time"] > server_killed["time"])
    failed = [e for e in events if e["event"] == "adapter_load" and not e.get("ok")]
    outside = [e for e in failed if not server_killed["time"] - 1 <= e["time"] <= restarted]
    assert outside == [], [(e["time"], e.get("error")) for e in outside]  # only while the server was dead
    rewards = [float(e["reward"]) for e in events if e["event"] == "step" and "reward" in e]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4, rewards
    assert "launching 2 trainer processes (FSDP2, gloo on the CPU)" in (run["state"] / "logs.txt").read_text()
    refused = _one_process_again(run, docker_client)
    third_fault_row.update(observed=f"paused in {trainer_killed['checkpoint'].rsplit('/', 1)[-1]} at step "
                                    f"{trainer_killed['step']}, killed; moved to quarantine/; resumed from "
                                    f"checkpoint-{resumed_step}; {MAX_STEPS}/{MAX_STEPS} steps; 1 process refused: "
                                    f"{refused}",
                           **{"steps lost": lost, "data lost": "the half-written checkpoint (kept in quarantine/)"})


def _one_process_again(run: dict, docker_client) -> str:
    """`up` of the same run with one trainer process and more steps: refused before any step, in one line naming the
    world sizes; nothing is left running."""
    assert cli(run, "down").returncode == 0
    data = yaml.safe_load(run["spec"].read_text())
    data["overrides"]["runtime"]["trainer_processes"] = 1
    data["overrides"]["trl"]["max_steps"] = MAX_STEPS + SAVE_EVERY
    run["spec"].write_text(yaml.safe_dump(data, sort_keys=False))
    proc = cli(run, "up", timeout=900)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "step 1" not in said, said[-3000:]
    (line,) = [ln for ln in said.splitlines() if "world_size 2 in the checkpoint, 1 in this run" in ln]
    assert "Start a new run" in line, line
    assert compose.containers(docker_client, RUN, all_=False) == [], "the refused up left containers running"
    return "world_size 2 in the checkpoint, 1 in this run"
