"""The multi-host deployer against two real test hosts (tests/testhosts.py: their own address, sshd and Docker
engine; one host directory mounted at the same path in both stands in for NFS), the deployer outside talking real SSH
with a generated key and known_hosts. The split rehearsal: server on spark2, trainer on spark1, images shipped over
SSH. Then the failures preflight must catch before anything starts, each naming cause and fix."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.clirun import run_cli as cli
from tests.interrupt import sigint_default
from tests.specs import split_spec
from tests.testhosts import SMALL_DIR, test_hosts

pytestmark = pytest.mark.docker
RUN = "split"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, cpu_image):
    with test_hosts(2, tmp_path_factory.mktemp("hosts"), small_disk={"spark1": "64m"}) as th:
        yield th


@pytest.fixture(scope="module")
def split_run(hosts, tmp_path_factory):
    """One `grpo-deploy up` across the two hosts, to the end, then status and down."""
    cwd = tmp_path_factory.mktemp("split")
    spec = split_spec(cwd / "split.yaml", RUN)
    ssh = ["--ssh-config", str(hosts.ssh_config)]
    up = cli("up", "-f", str(spec), "--fresh", "--keep", *ssh, cwd=cwd)
    status = cli("status", "-f", str(spec), "--json", *ssh, cwd=cwd, timeout=300)
    server_logs = cli("logs", "-f", str(spec), "--role", "server", "--tail", "5", *ssh, cwd=cwd, timeout=300)
    followed = follow_logs(cwd, "logs", "-f", str(spec), "--follow", "--tail", "3", *ssh)
    down = cli("down", "-f", str(spec), *ssh, cwd=cwd, timeout=300)
    yield {"up": up, "status": json.loads(status.stdout) if status.returncode == 0 else {}, "down": down,
           "server_logs": server_logs, "followed": followed, "cwd": cwd, "spec": spec}


def follow_logs(cwd: Path, *args: str, seconds: float = 15) -> str:
    """`grpo-deploy logs --follow` for a while, then Ctrl-C (SIGINT): what it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "grpo_deploy.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=sigint_default)
    time.sleep(seconds)
    still_following = proc.poll() is None
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    print(f"$ grpo-deploy {' '.join(args)} (following: {still_following})\n{out[-3000:]}")
    return out


def test_split_rehearsal_trains_to_the_end(split_run):
    assert split_run["up"].returncode == 0, split_run["up"].stdout[-3000:] + split_run["up"].stderr[-2000:]
    s = split_run["status"]
    assert s["steps"] >= 30 and s["adapter_loads_failed"] == 0 and s["adapter_loads_ok"] >= s["steps"]
    assert s["reward_last5"] > s["reward_first5"] + 0.1, (s["reward_first5"], s["reward_last5"])


def test_status_shows_both_hosts(split_run):
    rows = {(h["host"], h["role"]): h for h in split_run["status"]["hosts"]}
    assert rows[("spark1", "trainer")]["state"] == "exited (code 0)"
    assert rows[("spark2", "server")]["state"] == "running" and rows[("spark2", "server")]["health"] == "healthy"


def test_status_measures_the_checkpoint_disk_on_the_trainer_host(split_run):
    disk = split_run["status"]["checkpoint_disk"]
    assert disk["filesystem"].startswith("spark1:") and disk["free_bytes"] > 0 and disk["checkpoint_bytes"] > 0
    assert disk["ok"] is (disk["free_bytes"] >= disk["checkpoint_bytes"] + disk["margin_bytes"])


def test_logs_per_role_and_followed_across_hosts(split_run):
    server = split_run["server_logs"]
    assert server.returncode == 0 and "===== host spark2" in server.stdout
    assert "===== host spark1" not in server.stdout  # spark1 runs only the trainer
    followed = split_run["followed"].splitlines()
    assert any(line.startswith("spark1 | ") for line in followed), followed[-20:]
    assert any(line.startswith("spark2 | ") for line in followed), followed[-20:]
    assert "Traceback" not in split_run["followed"]


def test_images_were_shipped_over_ssh(split_run, hosts):
    out = split_run["up"].stdout
    assert "spark1: grpo-deploy/cpu:0.1.0" in out and "spark2: grpo-deploy/cpu:0.1.0" in out
    local = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", "grpo-deploy/cpu:0.1.0"],
                           capture_output=True, text=True).stdout.strip()
    assert hosts["spark1"].has_image("grpo-deploy/cpu:0.1.0") == local == hosts["spark2"].has_image(
        "grpo-deploy/cpu:0.1.0")


def test_server_published_only_on_the_address_the_trainer_uses(split_run, hosts):
    text = hosts["spark2"].exec(["sh", "-c", f"cat /home/deploy/.grpo-deploy/{RUN}/render/hosts/spark2.env"])
    assert f"GRPO_SERVER_PUBLISH={hosts['spark2'].ip}" in text.splitlines()


def test_down_leaves_no_container_of_the_run(split_run, hosts):
    assert split_run["down"].returncode == 0
    assert hosts["spark1"].run_containers(RUN) == [] and hosts["spark2"].run_containers(RUN) == []


# ------------------------------------------------------------------ refusals: nothing starts, cause and fix named

def _refused(hosts, tmp_path, spec: Path, *extra: str, check: str) -> str:
    proc = cli("up", "-f", str(spec), "--ssh-config", str(hosts.ssh_config), *extra, cwd=tmp_path, timeout=600)
    assert proc.returncode in (1, 2), proc.stdout[-2000:]
    assert "nothing was started" in proc.stdout + proc.stderr or proc.returncode == 2
    assert hosts["spark1"].run_containers(RUN) == [] and hosts["spark2"].run_containers(RUN) == []
    text = proc.stdout + proc.stderr
    if check:
        rows = [line for line in text.splitlines() if line.startswith(check) and "FAIL" in line]
        assert rows, text[-3000:]
    return " ".join(text.split())  # the table wraps its cells to the terminal's width


def test_split_uid_with_umask_077_refused(hosts, tmp_path, split_run):
    spec = split_spec(tmp_path / "s.yaml", **{"run.roles": {"trainer": {"uid": 2000, "gid": 2000, "umask": "0077"}}})
    text = _refused(hosts, tmp_path, spec, check="identity")
    assert "0600" in text and "remove run.roles" in text


def test_shared_directories_that_are_not_one_share_refused(hosts, tmp_path, split_run):
    hosts["spark2"].exec(["sh", "-c", "mkdir -p /srv/not-shared && chown 1000:1000 /srv/not-shared"])
    spec = split_spec(tmp_path / "s.yaml", **{"hosts.1.shared_dir": "/srv/not-shared"})
    text = _refused(hosts, tmp_path, spec, check="shared-volume")
    assert "not the same storage" in text and "same share" in text


def test_unreachable_host_refused(hosts, tmp_path, split_run):
    config = hosts.config_for(hosts.known_hosts, extra={"ghost": hosts["spark2"].ip.rsplit(".", 1)[0] + ".250"})
    spec = split_spec(tmp_path / "s.yaml", **{"hosts.1.address": "ghost"})
    proc = cli("preflight", "-f", str(spec), "--ssh-config", str(config), cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    assert any(line.startswith("reachable") and "ghost" in line or "FAIL" in line for line in proc.stdout.splitlines())
    assert "no answer from" in proc.stdout or "cannot connect" in proc.stdout


def test_unknown_host_key_refused(hosts, tmp_path, split_run):
    known = hosts.write_ssh_files(known=[hosts["spark1"]], path=tmp_path / "known_partial")
    config = hosts.config_for(known)
    spec = split_spec(tmp_path / "s.yaml")
    proc = cli("preflight", "-f", str(spec), "--ssh-config", str(config), cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    row = next(line for line in proc.stdout.splitlines() if line.startswith("reachable") and "spark2" in line)
    assert "FAIL" in row and "unknown host key" in proc.stdout and "--accept-new-host-keys" in proc.stdout


def test_disk_short_refused(hosts, tmp_path, split_run):
    spec = split_spec(tmp_path / "s.yaml", **{"hosts.0.shared_dir": SMALL_DIR})
    text = _refused(hosts, tmp_path, spec, check="disk")
    assert "DOES NOT FIT" in text or "runs out of disk" in text or "not even one checkpoint" in text


def test_different_vllm_versions_refused(hosts, tmp_path, split_run):
    tag = "grpo-deploy/cpu:vllm-dev-test"
    build = subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=(
        "FROM grpo-deploy/cpu:0.1.0\nLABEL org.grpo-deploy.vllm-version=0.28.0.dev0+gabc123\n"), text=True,
        capture_output=True)
    assert build.returncode == 0, build.stderr
    spec = split_spec(tmp_path / "s.yaml", **{"images.server": tag})
    text = _refused(hosts, tmp_path, spec, check="images")
    assert "0.28.0.dev0+gabc123" in text and "FROM the server image" in text
