"""Fault: the trainer is killed (SIGKILL) in the middle of a real checkpoint save — held there by the runtime's
`pause-mid-save` failpoint after the weights and optimizer state are written and before `trainer_state.json`.
`up` restarts the trainer, which quarantines the half-written checkpoint and resumes from the newest complete one;
the run ends with every step done."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

from grpo_deploy import compose, new_spec, resolve
from grpo_deploy.runtime.metrics import parse_events
from grpo_deploy.runtime.trl_hooks import FAILPOINT_DIR, PAUSE_MID_SAVE

RUN = "rehearsal"
ARM_AFTER_STEP = 21  # saves at 20 and 40: the pause lands on the save of step 40, the newest complete one is 20
UP_TIMEOUT_S = 1800


def test_trainer_killed_mid_save_resumes_from_the_newest_complete_checkpoint(tmp_path, cpu_image, docker_client,
                                                                             fault_row):
    res = resolve.resolve(new_spec.embedded_default())
    save_every, max_steps = res.settings.trl.save_steps, res.settings.trl.max_steps
    fault_row.update(fault=f"trainer SIGKILL during the save of step {max_steps} (local)",
                     expected="half-written checkpoint quarantined, not deleted; trainer restarted, resumes from the "
                              f"newest complete one; <= {save_every} steps lost")
    proc = subprocess.Popen([sys.executable, "-m", "grpo_deploy.cli", "up", "--fresh", "--keep"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(UP_TIMEOUT_S, proc.kill)
    watchdog.start()
    lines, armed, killed = [], False, {}
    try:
        for line in proc.stdout:
            lines.append(line)
            m = re.search(r"step (\d+)/(\d+)", line)
            if m and not armed and int(m.group(1)) >= ARM_AFTER_STEP:
                flag_dir = f"{res.checkpoint_dir}/{FAILPOINT_DIR}"
                code, out, err = compose.run_once(
                    docker_client, res.images["trainer"],
                    ["sh", "-c", f"mkdir -p {flag_dir} && echo 300 > {flag_dir}/{PAUSE_MID_SAVE}"],
                    res.identities["trainer"].user, res.spec.storage.volume, res.spec.storage.mount)
                assert code == 0, out + err
                armed = True
                killed = kill_when_paused(docker_client, res)
        code = proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        proc.kill()
    output = "".join(lines)
    try:
        assert killed.get("checkpoint"), "the trainer never paused in its save:\n" + output[-3000:]
        assert code == 0, output[-4000:]
        assert "the trainer exited with code 137" in output and "restarting the trainer" in output, output[-3000:]
        events = parse_events((tmp_path / ".grpo-deploy" / RUN / "metrics.jsonl").read_text())
        quarantined = [e for e in events if e["event"] == "checkpoint_quarantine"]
        assert [e["path"] for e in quarantined] == [killed["checkpoint"]], quarantined
        assert "/quarantine/" in quarantined[0]["moved_to"] and "half-written" in quarantined[0]["reason"]
        starts = [e for e in events if e["event"] == "run_start"]
        m = re.search(r"checkpoint-(\d+)$", starts[-1].get("resumed_from") or "")
        assert m, [e.get("resumed_from") for e in starts]
        resumed_step = int(m.group(1))
        lost = killed["step"] - resumed_step
        assert 0 < lost <= save_every, (killed["step"], resumed_step)
        steps = sorted({int(e["step"]) for e in events if e["event"] == "step"})
        assert steps[-1] == max_steps
        listed = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "checkpoints", "list", "--json"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=300)
        answer = json.loads(listed.stdout)
        assert [c["step"] for c in answer["checkpoints"] if c["state"] == "complete"][-1] == max_steps
        fault_row.update(observed=f"paused in {killed['checkpoint'].rsplit('/', 1)[-1]} and killed; quarantined to "
                                  f"{quarantined[0]['moved_to'].rsplit('/', 2)[-2]}/; resumed from "
                                  f"checkpoint-{resumed_step}; {steps[-1]}/{max_steps} steps",
                         **{"steps lost": lost, "data lost": "the half-written checkpoint (kept in quarantine/)"})
    finally:
        subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "down"], cwd=tmp_path, capture_output=True,
                       timeout=300)


def kill_when_paused(docker_client, res) -> dict:
    """Poll the trainer's metrics for the failpoint's event, then SIGKILL the trainer's container; the checkpoint it
    was writing and the last step it finished."""
    deadline = time.time() + 900
    while time.time() < deadline:
        (trainer,) = compose.containers(docker_client, RUN, "trainer")
        events = parse_events(compose.read_file(trainer, f"{res.run_dir}/metrics.jsonl") or "")
        paused = [e for e in events if e["event"] == "failpoint" and e.get("name") == PAUSE_MID_SAVE]
        if paused:
            trainer.kill()
            step = max(int(e["step"]) for e in events if e["event"] == "step")
            return {"checkpoint": paused[-1]["checkpoint"], "step": step}
        time.sleep(1)
    return {}
