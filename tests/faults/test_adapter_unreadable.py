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
import time

from grpo_deploy import compose
from grpo_deploy.runtime.metrics import parse_events

from .conftest import RUN, SAVE_EVERY
from .namespaces import hide_behind_root_dir, require_nsenter
from .running import cli, up_with_fault

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
    injected = {}

    def hide(step: int) -> None:
        (server,) = compose.containers(docker_client, RUN, "server")
        hide_behind_root_dir(server, lora_dir)
        injected.update(step=step, time=time.time())

    code, output = up_with_fault(fault_run, AT_STEP, hide)
    ended = time.time()
    (fault_run["cwd"] / "up-output.txt").write_text(output)  # kept with the run's folder, for a reader
    assert code == 1, output[-4000:]
    assert "Traceback" not in output and "does not expose" not in output, output[-4000:]
    assert "shared-volume fault (adapter-unreadable)" in output, output[-4000:]
    assert "could not read adapter trl-policy-v" in output and f"at {lora_dir}/trl-policy-v" in output
    events = parse_events((fault_run["state"] / "metrics.jsonl").read_text())
    (fault,) = [e for e in events if e["event"] == "storage_fault"]
    (end,) = [e for e in events if e["event"] == "run_end"]
    detect_s = fault["time"] - injected["time"]
    assert fault["kind"] == "adapter-unreadable" and fault["path"].startswith(f"{lora_dir}/trl-policy-v")
    assert 0 < detect_s < STOP_WITHIN_S and end["status"] == "storage-fault", (detect_s, end)
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

    listed = cli(fault_run, "checkpoints", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    states = {c["step"]: c["state"] for c in json.loads(listed.stdout)["checkpoints"]}
    last_step = int(end["steps"])  # the optimizer steps done, the one whose adapter failed to publish included
    newest = max(s for s, st in states.items() if st == "complete")
    assert set(states.values()) == {"complete"} and newest == SAVE_EVERY * (last_step // SAVE_EVERY), states
    lost = last_step - newest
    assert 0 <= lost <= SAVE_EVERY
    fault_row.update(observed=f"stopped {detect_s:.1f} s after the injection (up ended after "
                              f"{ended - injected['time']:.1f} s), at step {last_step}: 1 load answered "
                              f"{failed[0]['status']}, "
                              f"reported as 'adapter unreadable' with path, uid {uid}, the server's view ({lora_dir} "
                              "0700 root) and the fix in up/status; logs name it; "
                              f"server kept running; checkpoints {sorted(states)} complete",
                     **{"steps lost": lost, "data lost": f"none (resume from checkpoint-{newest})"})
