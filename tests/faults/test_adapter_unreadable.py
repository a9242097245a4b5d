"""Fault: the adapter directory on the shared volume becomes unreadable to the vLLM server mid-run.

What stands in for what: on the server's side only, the adapters directory (`<checkpoints>/.vllm_lora`) is covered by
an empty root-owned 0700 directory (a tmpfs mounted with nsenter in the server container's mount namespace) — what
the server sees when, on its host, the directory is chowned to root / chmod 0700, or NFS root-squashes it. The
trainer keeps the real directory and goes on publishing adapters there. The next load answers 404 "No adapter found",
which TRL reports as the server "does not expose /v1/load_lora_adapter"; the kit must instead stop the run with a
message that names the permission problem, the path, the uid and the fix — in `up`'s output, `status` and `logs`.

Why stop and not retry: a permission or mount change on the share does not heal by itself, every retry holds the
server paused, and the newest complete checkpoint makes fix-then-`up` cheap."""

from __future__ import annotations

import json

from tests.faults.conftest import SAVE_EVERY
from tests.faults.namespaces import hide_behind_root_dir, require_nsenter
from tests.faults.running import checkpoints_after_stop, cli, stopped_by_storage_fault

AT_STEP = 5  # saves at 4, 8, 12, 16: the newest complete checkpoint when the fault lands is checkpoint-4
STOP_WITHIN_S = 60


def test_adapter_dir_unreadable_to_the_server_stops_the_run_naming_path_and_uid(fault_run, cpu_image, docker_client,
                                                                                  fault_row):
    require_nsenter()
    res = fault_run["res"]
    lora_dir = f"{res.checkpoint_dir}/.vllm_lora"
    uid = res.identities["server"].uid
    fault_row.update(fault=f"adapter dir unreadable to the server (root 0700 in its view) at step {AT_STEP} (local)",
                     expected=f"run stops within {STOP_WITHIN_S} s; up/status/logs name the path, uid {uid} and the "
                              f"fix, not 'does not expose'; no traceback; checkpoints intact; <= {SAVE_EVERY} steps "
                              "lost")
    got = stopped_by_storage_fault(fault_run, docker_client, "server", AT_STEP,
                                   lambda server: hide_behind_root_dir(server, lora_dir), "adapter-unreadable",
                                   STOP_WITHIN_S)
    output, events, fault = got["output"], got["events"], got["fault"]
    assert "does not expose" not in output, output[-4000:]
    assert "could not read adapter trl-policy-v" in output and f"at {lora_dir}/trl-policy-v" in output
    assert fault["path"].startswith(f"{lora_dir}/trl-policy-v"), fault
    failed = [e for e in events if e["event"] == "adapter_load" and not e["ok"]]
    # vLLM 0.32 on CPU answered 500 "Call to add_lora method failed: Worker failed with error '[Errno 13] Permission
    # denied ...'" (a file it cannot open answers 404 "No adapter found"); TRL words both as a failed request.
    assert len(failed) == 1 and failed[0]["status"] in (400, 404, 500), failed

    status = cli(fault_run, "status", "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["state"] == "failed" and lora_dir in shown["fault"] and f"uid {uid}:" in shown["fault"]
    assert "chown -R" in shown["fault"] and "Traceback" not in status.stdout + status.stderr
    # the deployer looked from inside the server container, as the server's user: the covered directory, root 0700
    gid = res.identities["server"].gid
    server_sees = f"As the server (uid {uid}:{gid}) sees it: {lora_dir} is mode 0700, owner 0:0"
    assert server_sees in shown["fault"] and server_sees in output, shown["fault"]
    roles = {h["role"]: h["state"] for h in shown["hosts"]}
    assert roles["server"] == "running", roles  # the server itself is fine and stays up
    logs = cli(fault_run, "logs", "--role", "trainer")
    assert "adapter unreadable: the vLLM server could not read adapter" in logs.stdout + logs.stderr

    ck = checkpoints_after_stop(fault_run, got["end"], SAVE_EVERY)
    fault_row.update(observed=f"stopped {got['detect_s']:.1f} s after the injection (up ended after "
                              f"{got['up_s']:.1f} s), at step {ck['last_step']}: 1 load answered "
                              f"{failed[0]['status']}, "
                              f"reported as 'adapter unreadable' with path, uid {uid}, the server's view ({lora_dir} "
                              "0700 root) and the fix in up/status; logs name it; "
                              f"server kept running; checkpoints {ck['steps']} complete",
                     **{"steps lost": ck["lost"], "data lost": f"none (resume from checkpoint-{ck['newest']})"})
