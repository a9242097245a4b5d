"""Fault-suite helper: one `grpo-deploy up` in the background, its output read line by line so that a test can
inject its fault at a given optimizer step, with a watchdog that kills it after a bound; and what a server-kill test
checks of the run afterwards."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from grpo_deploy.common.metrics import parse_events

UP_TIMEOUT_S = 1800
STEP = re.compile(r"step (\d+)/(\d+)")


def up_with_fault(run: dict, at_step: int, inject: Callable[[int], None], *extra: str) -> tuple[int, str]:
    """`up --fresh --keep` of the fault run; *inject*(step) is called once, when the progress line of *at_step* (or a
    later one) is printed. Returns (exit code, everything `up` printed)."""
    return up_with_faults(run, [(at_step, inject)], *extra)


def up_with_faults(run: dict, faults: list[tuple[int, Callable[[int], None]]], *extra: str) -> tuple[int, str]:
    """up_with_fault with several faults, injected in order: each once, at the first progress line of its step (or a
    later one) printed after the one before it was injected (after a restart the steps count again from the resumed
    checkpoint)."""
    proc = subprocess.Popen([sys.executable, "-m", "grpo_deploy.cli", "up", "-f", str(run["spec"]), "--fresh",
                             "--keep", *extra], cwd=run["cwd"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    watchdog = threading.Timer(UP_TIMEOUT_S, proc.kill)
    watchdog.start()
    lines, pending = [], list(faults)
    try:
        for line in proc.stdout:
            lines.append(line)
            m = STEP.search(line)
            if m and pending and int(m.group(1)) >= pending[0][0]:
                _, inject = pending.pop(0)
                inject(int(m.group(1)))
        code = proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        proc.kill()
    output = "".join(lines)
    assert not pending, (f"the run never reached step {pending[0][0]}, so {len(pending)} fault(s) were not "
                         f"injected:\n{output[-3000:]}")
    return code, output


def cli(run: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_deploy.cli", *args, "-f", str(run["spec"])], cwd=run["cwd"],
                          capture_output=True, text=True, timeout=timeout)


def resumed_after_kill(metrics_text: str, killed: dict, max_steps: int, save_every: int, restarts: int = 1) -> dict:
    """After a server kill at killed["step"] (time killed["time"]): the run started again once after it, from a
    checkpoint at most one interval behind the last step trained before that restart, reached max_steps, and every
    adapter load after the restart succeeded. *restarts*: how many restarts the whole run had (a later fault may add
    its own). (The trainer may go on a few steps on rollouts it already holds after the kill, and save: seen on a
    fresh machine, killed at step 6, resumed from checkpoint-8, nothing lost.)"""
    events = parse_events(metrics_text)
    starts = [e for e in events if e["event"] == "run_start"]
    assert len(starts) == 1 + restarts, [e.get("resumed_from") for e in starts]
    restart = next(e for e in starts if e["time"] > killed["time"])
    m = re.search(r"checkpoint-(\d+)$", restart.get("resumed_from") or "")
    assert m, [e.get("resumed_from") for e in starts]
    resumed = int(m.group(1))
    trained = max(int(e["step"]) for e in events if e["event"] == "step" and e["time"] < restart["time"])
    lost = trained - resumed
    assert trained >= killed["step"] and 0 <= lost <= save_every, (killed["step"], trained, resumed)
    steps = sorted({int(e["step"]) for e in events if e["event"] == "step"})
    assert steps[-1] == max_steps
    after = [e for e in events if e["event"] == "adapter_load" and e["time"] > killed["time"] + 5]
    assert after and all(e["ok"] for e in after), [e.get("error") for e in after if not e["ok"]]
    return {"resumed": resumed, "lost": lost, "last_step": steps[-1], "loads_after": len(after)}


def stopped_by_storage_fault(run: dict, docker_client, role: str, at_step: int, inject: Callable, kind: str,
                             within_s: float) -> dict:
    """`up` of the fault run with *inject*(container of *role*) at *at_step*; the run must stop (exit 1, no
    traceback) with one storage_fault of *kind* recorded within *within_s* of the injection. up's output is kept
    beside the run (up-output.txt). Returns output, events, the fault and run_end events, and the timings."""
    from tests import compose

    injected = {}

    def injection(step: int) -> None:
        (container,) = compose.containers(docker_client, run["res"].spec.run.name, role)
        inject(container)
        injected.update(step=step, time=time.time())

    code, output = up_with_fault(run, at_step, injection)
    ended = time.time()
    (run["cwd"] / "up-output.txt").write_text(output)
    assert code == 1, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert f"shared-volume fault ({kind})" in output, output[-4000:]
    events = parse_events((run["state"] / "metrics.jsonl").read_text())
    (fault,) = [e for e in events if e["event"] == "storage_fault"]
    (end,) = [e for e in events if e["event"] == "run_end"]
    detect_s = fault["time"] - injected["time"]
    assert fault["kind"] == kind and 0 < detect_s < within_s and end["status"] == "storage-fault", (detect_s, end)
    return {"output": output, "events": events, "fault": fault, "end": end, "detect_s": detect_s,
            "up_s": ended - injected["time"]}


def checkpoints_after_stop(run: dict, end: dict, save_every: int) -> dict:
    """After a run stopped by a fault: every checkpoint complete, the newest the last save before the stop, at most
    one interval of steps lost."""
    listed = cli(run, "checkpoints", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    states = {c["step"]: c["state"] for c in json.loads(listed.stdout)["checkpoints"]}
    last_step = int(end["steps"])  # the optimizer steps done, the one whose adapter failed to publish included
    newest = max(s for s, st in states.items() if st == "complete")
    assert set(states.values()) == {"complete"} and newest == save_every * (last_step // save_every), states
    lost = last_step - newest
    assert 0 <= lost <= save_every
    return {"steps": sorted(states), "last_step": last_step, "newest": newest, "lost": lost}
