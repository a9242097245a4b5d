"""Fault: the vLLM server is killed (SIGKILL) in the middle of the CPU rehearsal. `status` must show it within
seconds; `up` restarts the server and the trainer, which resumes from its newest complete checkpoint; the run ends with
every step done and no more lost than one checkpoint interval."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

from grpo_deploy import compose, new_spec, resolve
from grpo_deploy.runtime.metrics import parse_events

RUN = "rehearsal"
KILL_AFTER_STEP = 22  # the embedded default saves at 20 and 40: the kill lands two steps past a checkpoint
UP_TIMEOUT_S = 1800


def cli(cwd, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_deploy.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def server_state(cwd) -> str:
    proc = cli(cwd, "status", "--json")
    hosts = json.loads(proc.stdout).get("hosts", []) if proc.returncode == 0 else []
    return " ".join(f"{h['state']}/{h['health']}" for h in hosts if h["role"] == "server")


def test_server_killed_mid_run_is_restarted_and_the_trainer_resumes(tmp_path, cpu_image, docker_client, fault_row):
    res = resolve.resolve(new_spec.embedded_default())
    save_every = res.settings.trl.save_steps
    fault_row.update(fault="vLLM server SIGKILL at step 22 of 40 (local)",
                     expected=f"status shows it in seconds; server + trainer restarted; resume from the newest "
                              f"checkpoint; <= {save_every} steps lost")
    proc = subprocess.Popen([sys.executable, "-m", "grpo_deploy.cli", "up", "--fresh", "--keep"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(UP_TIMEOUT_S, proc.kill)
    watchdog.start()
    lines, killed = [], {}
    try:
        for line in proc.stdout:
            lines.append(line)
            m = re.search(r"step (\d+)/(\d+)", line)
            if m and not killed and int(m.group(1)) >= KILL_AFTER_STEP:
                (server,) = compose.containers(docker_client, RUN, "server")
                server.kill()  # SIGKILL, as the kernel's OOM killer or `docker kill` would
                killed = {"step": int(m.group(1)), "time": time.time()}
                seen = server_state(tmp_path)
                killed["status_s"] = time.time() - killed["time"]
                killed["status"] = seen
        code = proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        proc.kill()
    output = "".join(lines)
    try:
        assert killed, "the run never reached the step at which the server is killed:\n" + output[-3000:]
        assert "exited" in killed["status"] and "137" in killed["status"], killed
        assert killed["status_s"] < 15, killed
        assert code == 0, output[-4000:]
        assert "restarting the server and the trainer" in output and "server ready again" in output
        events = parse_events((tmp_path / ".grpo-deploy" / RUN / "metrics.jsonl").read_text())
        starts = [e for e in events if e["event"] == "run_start"]
        resumed = starts[-1].get("resumed_from") or ""
        m = re.search(r"checkpoint-(\d+)$", resumed)
        assert len(starts) >= 2 and m, [e.get("resumed_from") for e in starts]
        resumed_step = int(m.group(1))
        lost = killed["step"] - resumed_step
        assert 0 <= lost <= save_every, (killed["step"], resumed_step)
        steps = sorted({int(e["step"]) for e in events if e["event"] == "step"})
        assert steps[-1] == res.settings.trl.max_steps
        after = [e for e in events if e["event"] == "adapter_load" and e["time"] > killed["time"] + 5]
        assert after and all(e["ok"] for e in after), [e.get("error") for e in after if not e["ok"]]
        fault_row.update(observed=f"status after {killed['status_s']:.1f} s: {killed['status']}; resumed from "
                                  f"checkpoint-{resumed_step}; {len(after)} adapter loads after, all OK; "
                                  f"{steps[-1]}/{res.settings.trl.max_steps} steps",
                         **{"steps lost": lost, "data lost": "none (newest checkpoint kept)"})
    finally:
        cli(tmp_path, "down", timeout=300)
