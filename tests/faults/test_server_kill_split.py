"""Fault: the vLLM server is killed (SIGKILL) on its own host in the middle of a run split over two SSH test hosts
(tests/testhosts.py: server on spark2, trainer on spark1, one host directory standing in for the NFS share). `status`
must show it within seconds, read over SSH; `up` restarts the server on spark2 and the trainer on spark1, which
resumes from its newest complete checkpoint and loads adapters on the new server; no more than one checkpoint
interval is lost.

About 9 minutes on 2 cores: NOT in `make test` (CI's 60-minute budget; the same restart path runs in CI on one host,
tests/faults/test_server_kill.py, and the split run itself in tests/integration/test_multihost.py);
`make test-faults-hosts` runs it (marker faults_hosts)."""

from __future__ import annotations

import json
import time

import pytest

from tests.faults.conftest import MAX_STEPS, SAVE_EVERY
from tests.faults.running import cli, resumed_after_kill, up_with_fault
from tests.specs import split_spec
from tests.testhosts import test_hosts

pytestmark = [pytest.mark.docker, pytest.mark.faults_hosts]
RUN = "faults-split"
KILL_AT_STEP = 6  # saves at 4, 8, 12, 16: the kill lands two steps past a checkpoint


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, cpu_image):
    with test_hosts(2, tmp_path_factory.mktemp("hosts")) as th:
        yield th


@pytest.fixture()
def split_run(hosts, tmp_path):
    path = split_spec(tmp_path / "split.yaml", RUN, **{"checkpoints.save_every": SAVE_EVERY,
                                                        "overrides": {"trl": {"max_steps": MAX_STEPS}}})
    run = {"cwd": tmp_path, "spec": path, "ssh": ("--ssh-config", str(hosts.ssh_config))}
    yield run
    cli(run, "down", *run["ssh"])
    assert hosts["spark1"].run_containers(RUN) == [] and hosts["spark2"].run_containers(RUN) == []


def test_server_killed_on_its_host_is_restarted_and_the_trainer_resumes(hosts, split_run, fault_row):
    fault_row.update(fault=f"vLLM server SIGKILL at step {KILL_AT_STEP} of {MAX_STEPS} (split: server on spark2, "
                           "trainer on spark1, over SSH)",
                     expected=f"status over SSH shows it within 15 s; server + trainer restarted on their hosts; "
                              f"resume from the newest complete checkpoint; <= {SAVE_EVERY} steps lost")
    killed = {}

    def kill_server(step: int) -> None:
        (server,) = [c for c in hosts["spark2"].run_containers(RUN)]
        hosts["spark2"].exec(["docker", "kill", server])  # SIGKILL, inside the server's host
        killed.update(step=step, time=time.time())
        status = cli(split_run, "status", "--json", *split_run["ssh"], timeout=120)
        rows = json.loads(status.stdout).get("hosts", []) if status.returncode == 0 else []
        killed["status"] = " ".join(f"{h['host']}:{h['state']}/{h['health']}" for h in rows if h["role"] == "server")
        killed["status_s"] = time.time() - killed["time"]

    code, output = up_with_fault(split_run, KILL_AT_STEP, kill_server, *split_run["ssh"])
    assert "spark2:exited" in killed["status"] and "137" in killed["status"], killed
    assert killed["status_s"] < 15, killed
    assert code == 0, output[-4000:]
    assert "restarting the server and the trainer" in output and "server ready again" in output, output[-3000:]
    assert "Traceback" not in output
    got = resumed_after_kill((split_run["cwd"] / ".grpo-deploy" / RUN / "metrics.jsonl").read_text(), killed,
                             MAX_STEPS, SAVE_EVERY)
    fault_row.update(observed=f"status over SSH after {killed['status_s']:.1f} s: {killed['status']}; resumed from "
                              f"checkpoint-{got['resumed']}; {got['loads_after']} adapter loads on the new server, all "
                              f"OK; {got['last_step']}/{MAX_STEPS} steps",
                     **{"steps lost": got["lost"], "data lost": "none"})
