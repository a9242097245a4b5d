"""Fault: a trainer of two processes (FSDP2 over gloo, sharded checkpoints) is killed (SIGKILL) in the middle of a
real checkpoint save — held there by the runtime's `pause-mid-save` failpoint on rank 0 after both ranks' weight and
optimizer shards are written and before `trainer_state.json`. `up` restarts the trainer, whose launcher quarantines
the half-written checkpoint (never deletes it) and resumes both ranks from the newest complete one; the run ends with
every step done. Then the same run with one trainer process is refused in one line: its checkpoints hold two ranks."""

from __future__ import annotations

import json
import re
import time

import yaml

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.hosts import oneoff
from grpo_deploy.hosts.connect import LocalHost
from grpo_deploy.runtime.trainer.trl_hooks import FAILPOINT_DIR, PAUSE_MID_SAVE
from tests import compose
from tests.faults.conftest import MAX_STEPS, RUN, SAVE_EVERY
from tests.faults.running import cli, up_with_fault

ARM_AT_STEP = 9  # saves at 4, 8, 12, 16: the pause holds the save of step 12, the newest complete one is 8


def test_trainer_killed_mid_save_resumes_from_the_newest_complete_checkpoint(two_process_run, cpu_image,
                                                                             docker_client, fault_row):
    fault_run = two_process_run
    res = fault_run["res"]
    fault_row.update(fault="trainer of 2 processes (FSDP2) SIGKILLed in the middle of a sharded checkpoint save "
                           "(local)",
                     expected="half-written checkpoint quarantined, not deleted; trainer restarted, both ranks resume "
                              f"from the newest complete one; <= {SAVE_EVERY} steps lost; 1 process then refused")
    killed = {}

    def arm_and_kill(step: int) -> None:
        flag_dir = f"{res.checkpoint_dir}/{FAILPOINT_DIR}"
        armed = oneoff.run(LocalHost(), res.images["trainer"],
                           ["sh", "-c", f"mkdir -p {flag_dir} && echo 300 > {flag_dir}/{PAUSE_MID_SAVE}"],
                           ident=res.identities["trainer"], share=(res, None))
        assert armed.ok, armed.out + armed.err
        deadline = time.time() + 600
        while time.time() < deadline and not killed:
            (trainer,) = compose.containers(docker_client, RUN, "trainer")
            events = parse_events(compose.read_file(trainer, f"{res.run_dir}/metrics.jsonl") or "")
            paused = [e for e in events if e["event"] == "failpoint" and e.get("name") == PAUSE_MID_SAVE]
            if paused:
                trainer.kill()
                killed.update(checkpoint=paused[-1]["checkpoint"],
                              step=max(int(e["step"]) for e in events if e["event"] == "step"))
            time.sleep(0.5)

    code, output = up_with_fault(fault_run, ARM_AT_STEP, arm_and_kill)
    assert killed, "the trainer never paused in its save:\n" + output[-3000:]
    assert code == 0, output[-4000:]
    assert "the trainer exited with code 137" in output and "restarting the trainer;" in output, output[-3000:]
    events = parse_events((fault_run["state"] / "metrics.jsonl").read_text())
    quarantined = [e for e in events if e["event"] == "checkpoint_quarantine"]
    assert [e["path"] for e in quarantined] == [killed["checkpoint"]], quarantined
    assert "/quarantine/" in quarantined[0]["moved_to"] and "half-written" in quarantined[0]["reason"]
    starts = [e for e in events if e["event"] == "run_start"]
    m = re.search(r"checkpoint-(\d+)$", starts[-1].get("resumed_from") or "")
    assert m, [e.get("resumed_from") for e in starts]
    resumed_step = int(m.group(1))
    lost = killed["step"] - resumed_step
    assert 0 < lost <= SAVE_EVERY, (killed["step"], resumed_step)
    assert max(int(e["step"]) for e in events if e["event"] == "step") == MAX_STEPS
    listed = cli(fault_run, "checkpoints", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    listing = json.loads(listed.stdout)["checkpoints"]
    complete = [c["step"] for c in listing if c["state"] == "complete"]
    assert complete[-1] == MAX_STEPS, complete
    assert {c["world_size"] for c in listing if c["state"] == "complete"} == {2}, listing
    assert all(e.get("ok") for e in events if e["event"] == "adapter_load"), "an adapter load failed"
    rewards = [float(e["reward"]) for e in events if e["event"] == "step" and "reward" in e]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4, rewards
    assert "launching 2 trainer processes (FSDP2, gloo on the CPU)" in (fault_run["state"] / "logs.txt").read_text()
    refused = _one_process_again(fault_run, docker_client)
    fault_row.update(observed=f"paused in {killed['checkpoint'].rsplit('/', 1)[-1]} at step {killed['step']}, "
                              f"killed; moved to quarantine/; resumed from checkpoint-{resumed_step}; "
                              f"{MAX_STEPS}/{MAX_STEPS} steps",
                     **{"steps lost": lost, "data lost": "the half-written checkpoint (kept in quarantine/)"})
    fault_row["observed"] += f"; 1 process refused: {refused}"


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
