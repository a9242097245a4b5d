"""A trainer across two SSH test hosts (tests/testhosts.py: their own address, sshd and Docker engine; one host
directory at the same path in both stands in for the share): one FSDP2 process group of two ranks over gloo, machine 0
on spark1 beside the real vLLM CPU server, machine 1 on spark2, each trainer container on its host's network.

One run through a fault: machine 1's trainer container SIGKILLed on its host mid-run. `up` stops the trainer on both
hosts, starts both again; machine 0's launcher resolves the newest complete checkpoint and machine 1's ranks take it
from rank 0; the run ends with every step done. Then the same run with one trainer host is refused in one line: its
checkpoints hold two ranks."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from grpo_deploy.common.metrics import parse_events
from tests.clirun import run_cli
from tests.faults.running import up_with_fault
from tests.specs import split_spec
from tests.testhosts import test_hosts

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.trainer_hosts]

RUN = "trainer-hosts"
STEPS, SAVE_EVERY = 16, 4
KILL_AT = 6  # two steps past checkpoint-4


def trainer_hosts_spec(path: Path, **changes) -> Path:
    """The cpu rehearsal with a trainer on both test hosts: spark1 machine 0 and the server, spark2 machine 1."""
    return split_spec(path, RUN, **{"hosts.0.roles": ["trainer", "server"], "hosts.1.roles": ["trainer"],
                                    "checkpoints.save_every": SAVE_EVERY,
                                    "overrides": {"trl": {"max_steps": STEPS}}, **changes})


def cli(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, timeout=timeout)


def trainer_container(host) -> str | None:
    out = host.exec(["docker", "ps", "-q", "--filter", f"label=org.grpo-deploy.run={RUN}",
                     "--filter", "label=org.grpo-deploy.role=trainer"], check=False).split()
    return out[0] if out else None


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, cpu_image):
    with test_hosts(2, tmp_path_factory.mktemp("hosts")) as th:
        yield th


@pytest.fixture(scope="module")
def trainer_hosts_run(hosts, tmp_path_factory):
    """One `up` to the end through a kill of machine 1's trainer container, then status, machine 1's log and down."""
    cwd = tmp_path_factory.mktemp("trainer-hosts")
    spec = trainer_hosts_spec(cwd / "trainers.yaml")
    ssh = ["--ssh-config", str(hosts.ssh_config)]
    killed = {}

    def kill_machine_1(step: int) -> None:
        container = trainer_container(hosts["spark2"])
        killed["log"] = hosts["spark2"].exec(["sh", "-c", f"docker logs {container} 2>&1"], check=False)
        hosts["spark2"].exec(["docker", "kill", container])  # SIGKILL, on machine 1's host
        killed.update(step=step, time=time.time())

    code, output = up_with_fault({"spec": spec, "cwd": cwd}, KILL_AT, kill_machine_1, "--restarts", "2", *ssh)
    print(output)  # shown with a failing test's report
    status = cli(cwd, "status", "-f", str(spec), "--json", *ssh, timeout=300)
    logs = cli(cwd, "logs", "-f", str(spec), "--host", "spark2", *ssh, timeout=300)
    down = cli(cwd, "down", "-f", str(spec), *ssh, timeout=300)
    events = parse_events((hosts.shared_host_dir / "runs" / RUN / "metrics.jsonl").read_text())
    yield {"code": code, "output": output, "killed": killed, "events": events, "cwd": cwd, "spec": spec,
           "status": json.loads(status.stdout) if status.returncode == 0 else {}, "logs": logs, "down": down,
           "ssh": ssh}


def test_one_group_over_both_hosts_trains_to_the_end(trainer_hosts_run):
    run = trainer_hosts_run
    out = run["output"]
    assert run["code"] == 0, out[-5000:]
    assert "Traceback" not in out
    assert "the trainer on spark1, spark2 (one process group; machine 0 on spark1)" in out, out[:3000]
    steps = sorted({int(e["step"]) for e in run["events"] if e["event"] == "step"})
    assert steps[-1] == STEPS, steps
    rewards = [e["reward"] for e in run["events"] if e["event"] == "step" and "reward" in e]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first, (first, last)
    loads = [e for e in run["events"] if e["event"] == "adapter_load"]
    assert loads and all(e.get("ok") for e in loads), [e for e in loads if not e.get("ok")]


def test_machine_1_ran_its_rank_on_spark2_over_the_network(trainer_hosts_run):
    log = trainer_hosts_run["killed"]["log"]
    m = re.search(r"launching 1 trainer process on machine 1 of 2 \(rendezvous ([\d.]+):29500, interface "
                  r"(\w+)\)", log)
    assert m, log[-3000:]
    assert m.group(1) != "127.0.0.1"  # machine 0 by spark1's own address


def test_machine_1_killed_restarts_both_and_resumes_from_the_newest_complete_checkpoint(trainer_hosts_run, fault_row):
    run = trainer_hosts_run
    events, killed = run["events"], run["killed"]
    starts = [e for e in events if e["event"] == "run_start"]
    assert len(starts) == 2, [e.get("resumed_from") for e in starts]
    resumed = int(re.search(r"checkpoint-(\d+)$", starts[-1].get("resumed_from") or "checkpoint-0").group(1))
    trained = max(int(e["step"]) for e in events if e["event"] == "step" and e["time"] < starts[-1]["time"])
    lost = trained - resumed
    # 0 lost: the trainer had saved the step it was at when the kill landed (seen on a fresh machine)
    assert trained >= killed["step"] and 0 <= lost <= SAVE_EVERY, (killed, trained, resumed)
    assert "starting the trainer again on spark1, spark2" in run["output"], run["output"][-3000:]
    assert "the trainer on spark2 (machine 1 of 2) exited with code 137" in run["output"]
    listed = cli(run["cwd"], "checkpoints", "list", "-f", str(run["spec"]), "--json", *run["ssh"])
    assert listed.returncode == 0, listed.stdout + listed.stderr
    complete = [c for c in json.loads(listed.stdout)["checkpoints"] if c["state"] == "complete"]
    assert complete[-1]["step"] == STEPS and {c["world_size"] for c in complete} == {2}, complete
    fault_row.update(fault=f"trainer across 2 hosts (1 process each, FSDP2 over gloo): machine 1's container "
                           f"SIGKILLed at step {killed['step']} of {STEPS}",
                     expected=f"the trainer stopped and started again on both hosts, resumed from the newest "
                              f"complete checkpoint, <= {SAVE_EVERY} steps lost",
                     observed=f"trained to step {trained}, resumed from checkpoint-{resumed}; {STEPS}/{STEPS} steps",
                     **{"steps lost": lost, "data lost": "none"})


def test_status_shows_the_trainer_on_both_hosts_and_down_leaves_nothing(trainer_hosts_run, hosts):
    run = trainer_hosts_run
    rows = {(h["host"], h["role"]) for h in run["status"].get("hosts", [])}
    assert {("spark1", "trainer"), ("spark1", "server"), ("spark2", "trainer")} <= rows, run["status"]
    assert run["logs"].returncode == 0 and "machine 1 of 2" in run["logs"].stdout
    assert run["down"].returncode == 0
    assert hosts["spark1"].run_containers(RUN) == [] and hosts["spark2"].run_containers(RUN) == []


def test_one_trainer_host_on_these_checkpoints_is_refused_in_one_line(trainer_hosts_run, hosts, tmp_path):
    data = yaml.safe_load(trainer_hosts_run["spec"].read_text())
    data["hosts"] = data["hosts"][:1]
    data["overrides"]["trl"]["max_steps"] = STEPS + SAVE_EVERY
    spec = tmp_path / "one.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = cli(trainer_hosts_run["cwd"], "up", "-f", str(spec), *trainer_hosts_run["ssh"], timeout=900)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "step 1/" not in said and "Traceback" not in said, said[-3000:]
    (line,) = [ln for ln in said.splitlines() if "world_size 2 in the checkpoint, 1 in this run" in ln]
    assert hosts["spark1"].run_containers(RUN) == [], "the refused up left containers running"
