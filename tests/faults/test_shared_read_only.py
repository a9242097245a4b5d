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

from grpo_deploy.hosts import oneoff
from grpo_deploy.hosts.connect import LocalHost
from tests.faults.conftest import SAVE_EVERY
from tests.faults.namespaces import make_read_only, require_nsenter
from tests.faults.running import checkpoints_after_stop, cli, stopped_by_storage_fault

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
    got = stopped_by_storage_fault(fault_run, docker_client, "trainer", AT_STEP,
                                   lambda trainer: make_read_only(trainer, ckpt), "read-only", STOP_WITHIN_S)
    output, fault = got["output"], got["fault"]
    assert ckpt in output and "is read-only" in output
    assert (fault["path"] + "/").startswith(f"{ckpt}/"), fault
    assert re.search(rf"; mount {ckpt} \(.*, ro[,)]", fault["message"]), fault["message"]  # its mount table
    assert "remount the share read-write" in fault["message"] and "is kept" in fault["message"]

    status = cli(fault_run, "status", "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["state"] == "failed" and "is read-only" in shown["fault"] and ckpt in shown["fault"]
    logs = cli(fault_run, "logs", "--role", "trainer")
    assert "is read-only" in logs.stdout + logs.stderr

    ck = checkpoints_after_stop(fault_run, got["end"], SAVE_EVERY)
    assert f"checkpoint-{ck['newest']} is kept" in fault["message"], fault["message"]
    found = oneoff.run(LocalHost(), res.images["trainer"], ["find", ckpt, "-name", ".*.tmp", "-o", "-name", "*.tmp"],
                       ident=res.identities["trainer"], share=(res, None))
    assert found.ok and found.out.strip() == "", found.out + found.err  # no staged adapter or checkpoint left behind
    fault_row.update(observed=f"EROFS at step {ck['last_step']}, stopped {got['detect_s']:.1f} s after the injection "
                              f"(up ended after {got['up_s']:.1f} s); up/status/logs: '{fault['path']} is "
                              f"read-only', remount + resume; checkpoints {ck['steps']} complete, no .tmp left",
                     **{"steps lost": ck["lost"], "data lost": f"none (resume from checkpoint-{ck['newest']})"})
