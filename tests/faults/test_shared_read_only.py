"""Fault: the shared directory where checkpoints and adapters go turns read-only under the trainer mid-run.

What stands in for what: in the trainer container's mount namespace only, the checkpoint directory on the shared
volume (`<run>/checkpoints`, which holds `checkpoint-N/` and `.vllm_lora/`) is bind-mounted onto itself and remounted
read-only (nsenter as root on the Docker host) — the trainer then gets a real EROFS, as from an NFS export switched
to ro or a filesystem remounted read-only after I/O errors. (A remount of the whole volume is refused while the
trainer holds its metrics file open for writing, so the run directory itself stays writable: the metrics file still
records the stop.) The kit must detect it at the next write, stop the run with one message (which path, read-only,
what to do), keep the newest complete checkpoint and leave nothing half-written."""

from __future__ import annotations

import json
import re
import time

from grpo_deploy import compose
from grpo_deploy.runtime.metrics import parse_events

from .conftest import RUN, SAVE_EVERY
from .namespaces import make_read_only, require_nsenter
from .running import cli, up_with_fault

AT_STEP = 5  # saves at 4, 8, 12, 16: checkpoint-4 is complete when the share turns read-only
STOP_WITHIN_S = 60


def test_shared_dir_read_only_stops_the_run_keeping_the_newest_checkpoint(fault_run, cpu_image, docker_client,
                                                                          fault_row):
    require_nsenter()
    res = fault_run["res"]
    ckpt = res.checkpoint_dir
    fault_row.update(fault=f"checkpoint dir on the share read-only (EROFS) for the trainer at step {AT_STEP} "
                           "(local)",
                     expected=f"run stops within {STOP_WITHIN_S} s, naming the path and 'read-only' and the fix; no "
                              "traceback; newest complete checkpoint kept; nothing half-written; "
                              f"<= {SAVE_EVERY} steps lost")
    injected = {}

    def freeze(step: int) -> None:
        (trainer,) = compose.containers(docker_client, RUN, "trainer")
        make_read_only(trainer, ckpt)
        injected.update(step=step, time=time.time())

    code, output = up_with_fault(fault_run, AT_STEP, freeze)
    ended = time.time()
    (fault_run["cwd"] / "up-output.txt").write_text(output)  # kept with the run's folder, for a reader
    assert code == 1, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert "shared-volume fault (read-only)" in output and ckpt in output and "is read-only" in output
    events = parse_events((fault_run["state"] / "metrics.jsonl").read_text())
    (fault,) = [e for e in events if e["event"] == "storage_fault"]
    (end,) = [e for e in events if e["event"] == "run_end"]
    detect_s = fault["time"] - injected["time"]
    assert fault["kind"] == "read-only" and (fault["path"] + "/").startswith(f"{ckpt}/"), fault
    assert re.search(rf"; mount {ckpt} \(.*, ro[,)]", fault["message"]), fault["message"]  # its mount table
    assert 0 < detect_s < STOP_WITHIN_S and end["status"] == "storage-fault", (detect_s, end)
    assert "remount the share read-write" in fault["message"] and "is kept" in fault["message"]

    status = cli(fault_run, "status", "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["state"] == "failed" and "is read-only" in shown["fault"] and ckpt in shown["fault"]
    logs = cli(fault_run, "logs", "--role", "trainer")
    assert "is read-only" in logs.stdout + logs.stderr

    listed = cli(fault_run, "checkpoints", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    states = {c["step"]: c["state"] for c in json.loads(listed.stdout)["checkpoints"]}
    last_step = int(end["steps"])  # the optimizer steps done, the one whose adapter failed to publish included
    newest = max(s for s, st in states.items() if st == "complete")
    assert set(states.values()) == {"complete"} and newest == SAVE_EVERY * (last_step // SAVE_EVERY), states
    assert f"checkpoint-{newest} is kept" in fault["message"], fault["message"]
    code_, out, err = compose.run_once(docker_client, res.images["trainer"],
                                       ["find", ckpt, "-name", ".*.tmp", "-o", "-name", "*.tmp"],
                                       res.identities["trainer"].user, res.spec.storage.volume,
                                       res.spec.storage.mount)
    assert code_ == 0 and out.strip() == "", out + err  # no staged adapter or checkpoint left behind
    lost = last_step - newest
    assert 0 <= lost <= SAVE_EVERY
    fault_row.update(observed=f"EROFS at step {last_step}, stopped {detect_s:.1f} s after the injection (up ended "
                              f"after {ended - injected['time']:.1f} s); up/status/logs: '{fault['path']} is "
                              f"read-only', remount + resume; checkpoints {sorted(states)} complete, no .tmp left",
                     **{"steps lost": lost, "data lost": f"none (resume from checkpoint-{newest})"})
