"""The multi-host deployer against two real test hosts (tests/testhosts.py: their own address, sshd and Docker
engine; one host directory mounted at the same path in both stands in for NFS), the deployer outside talking real SSH
with a generated key and known_hosts: the failures preflight must catch before anything starts, each naming cause and
fix. The split rehearsal itself (server on spark2, trainer on spark1, images shipped over SSH, through a server kill)
is tests/faults/test_server_kill_split.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.clirun import run_cli as cli
from tests.specs import split_spec
from tests.testhosts import SMALL_DIR, test_hosts

pytestmark = pytest.mark.docker
RUN = "split"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, cpu_image):
    with test_hosts(2, tmp_path_factory.mktemp("hosts"), small_disk={"spark1": "64m"}) as th:
        yield th


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


def test_split_uid_with_umask_077_refused(hosts, tmp_path):
    spec = split_spec(tmp_path / "s.yaml", **{"run.roles": {"trainer": {"uid": 2000, "gid": 2000, "umask": "0077"}}})
    text = _refused(hosts, tmp_path, spec, check="identity")
    assert "0600" in text and "remove run.roles" in text


def test_shared_directories_that_are_not_one_share_refused(hosts, tmp_path):
    hosts["spark2"].exec(["sh", "-c", "mkdir -p /srv/not-shared && chown 1000:1000 /srv/not-shared"])
    spec = split_spec(tmp_path / "s.yaml", **{"hosts.1.shared_dir": "/srv/not-shared"})
    text = _refused(hosts, tmp_path, spec, check="shared-volume")
    assert "not the same storage" in text and "same share" in text


def test_unreachable_host_refused(hosts, tmp_path):
    config = hosts.config_for(hosts.known_hosts, extra={"ghost": hosts["spark2"].ip.rsplit(".", 1)[0] + ".250"})
    spec = split_spec(tmp_path / "s.yaml", **{"hosts.1.address": "ghost"})
    proc = cli("preflight", "-f", str(spec), "--ssh-config", str(config), cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    assert any(line.startswith("reachable") and "ghost" in line or "FAIL" in line for line in proc.stdout.splitlines())
    assert "no answer from" in proc.stdout or "cannot connect" in proc.stdout


def test_unknown_host_key_refused(hosts, tmp_path):
    known = hosts.write_ssh_files(known=[hosts["spark1"]], path=tmp_path / "known_partial")
    config = hosts.config_for(known)
    spec = split_spec(tmp_path / "s.yaml")
    proc = cli("preflight", "-f", str(spec), "--ssh-config", str(config), cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    row = next(line for line in proc.stdout.splitlines() if line.startswith("reachable") and "spark2" in line)
    assert "FAIL" in row and "unknown host key" in proc.stdout and "--accept-new-host-keys" in proc.stdout


def test_disk_short_refused(hosts, tmp_path):
    spec = split_spec(tmp_path / "s.yaml", **{"hosts.0.shared_dir": SMALL_DIR})
    text = _refused(hosts, tmp_path, spec, check="disk")
    assert "DOES NOT FIT" in text or "runs out of disk" in text or "not even one checkpoint" in text


def test_different_vllm_versions_refused(hosts, tmp_path):
    tag = "grpo-deploy/cpu:vllm-dev-test"
    build = subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=(
        "FROM grpo-deploy/cpu:0.1.0\nLABEL org.grpo-deploy.vllm-version=0.28.0.dev0+gabc123\n"), text=True,
        capture_output=True)
    assert build.returncode == 0, build.stderr
    spec = split_spec(tmp_path / "s.yaml", **{"images.server": tag})
    text = _refused(hosts, tmp_path, spec, check="images")
    assert "0.28.0.dev0+gabc123" in text and "FROM the server image" in text
