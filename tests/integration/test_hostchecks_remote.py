"""`grpo-deploy check` (grpo_deploy.hostchecks) against two real test hosts (tests/testhosts.py: own sshd, Docker engine
and Compose; one host directory mounted at /srv/grpo-shared in both), reached over real SSH with the harness's
ssh_config, known_hosts and key: the cpu rehearsal split over spark1 (trainer) and spark2 (server) passes every host
check, the same as plain pytest; then hosts broken on purpose fail the named check, naming the host, with exit 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_deploy.hosts.connect import SshHost, SshOptions, on_all
from grpo_deploy.hosts.ship import ship
from tests.check_output import check_lines
from tests.clirun import run_cli as cli
from tests.testhosts import SHARED_DIR, hosts_fixture, two_host_spec

pytestmark = pytest.mark.docker

hosts = hosts_fixture(2)
HOST_CHECKS = ("shared_dir_present", "shared_dir_owner", "shared_dir_mode", "login_user_can_use_docker",
               "docker_engine_answers", "compose_v2_answers", "checkpoint_disk_headroom")
SKIPPED = ("nfs_mount", "nvidia_runtime", "gpus_visible")  # no storage.nfs; the cpu profile wants no CUDA


@pytest.fixture(scope="module")
def spec(hosts, tmp_path_factory) -> Path:
    """The two-host cpu spec (testhosts.two_host_spec), addresses = the SSH aliases."""
    return two_host_spec(tmp_path_factory.mktemp("hostchecks"))


@pytest.fixture(scope="module")
def shipped(hosts, cpu_image) -> str:
    """The cpu image on both hosts at once (the cross-host probe runs in the run's images; on a fresh machine this is
    the first module to send it, gigabytes to each host); only missing layers are sent."""
    conns = [SshHost(name, name, SshOptions(str(hosts.ssh_config))) for name in hosts.names]
    try:
        for name, result in on_all(conns, lambda conn: ship(cpu_image, conn)).items():
            assert not isinstance(result, Exception), f"{name}: {result}"
            print(result)
    finally:
        for conn in conns:
            conn.close()
    return cpu_image


def check(spec: Path, hosts, *extra: str, ssh_config: Path | None = None) -> subprocess.CompletedProcess:
    return cli("check", "-f", str(spec), "--ssh-config", str(ssh_config or hosts.ssh_config), *extra,
               cwd=spec.parent)


def test_check_passes_on_two_hosts(spec, hosts, shipped):
    proc = check(spec, hosts)
    got = check_lines(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in HOST_CHECKS:
        assert got[("spark1", name)].startswith("PASS") and got[("spark2", name)].startswith("PASS"), name
    assert got[("spark1->spark2", "shared_dir_cross_host_write_read")].startswith("PASS")
    for name in SKIPPED:
        assert got[("spark1", name)].startswith("SKIP") and got[("spark2", name)].startswith("SKIP"), name
    assert "0 failed" in proc.stdout


def test_plain_pytest_passes_the_same_checks(spec, hosts, shipped):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "grpo_deploy.hostchecks.plugin", "--pyargs",
                           "grpo_deploy.hostchecks", "--hosts=paramiko://spark1,paramiko://spark2",
                           f"--ssh-config={hosts.ssh_config}", f"--spec={spec}", "-p", "no:cacheprovider", "-q",
                           "-rs"], cwd=spec.parent, capture_output=True, text=True, timeout=600)
    print(proc.stdout[-5000:], proc.stderr[-2000:])
    assert proc.returncode == 0
    assert f"{len(HOST_CHECKS) * 2 + 1} passed" in proc.stdout


def test_a_shared_dir_owned_by_another_uid_fails_on_every_host(spec, hosts, shipped):
    # One directory behind both hosts: both see it. Recursively: the probe writes under the run's own folder, which
    # an earlier check left there owned by the run user (writable, so the probe would rightly pass).
    hosts["spark1"].exec(["chown", "-R", "4242:1000", SHARED_DIR])
    try:
        proc = check(spec, hosts)
    finally:
        hosts["spark1"].exec(["chown", "-R", "1000:1000", SHARED_DIR])
    got = check_lines(proc.stdout)
    assert proc.returncode == 1
    for name in ("spark1", "spark2"):
        line = got[(name, "shared_dir_owner")]
        assert line.startswith("FAIL") and f"{name}: {SHARED_DIR} is owned by 4242:1000" in line
        assert "chown 1000:1000" in line
    probe = got[("spark1->spark2", "shared_dir_cross_host_write_read")]
    assert probe.startswith("FAIL") and "the trainer identity UID 1000:1000" in probe and "cannot write" in probe
    assert "on spark1" in probe and "writable by UID 1000" in probe


def test_a_host_with_its_own_shared_dir_fails_that_host_and_the_probe(spec, hosts, shipped):
    """spark2 gets a directory of its own at /srv/grpo-shared (a tmpfs over the share, owned by root): its owner
    check fails and the file spark1 writes is not seen on spark2; spark1's own checks still pass."""
    hosts["spark2"].exec(["mount", "-t", "tmpfs", "-o", "size=16m,mode=1777", "tmpfs", SHARED_DIR])
    try:
        proc = check(spec, hosts)
    finally:
        hosts["spark2"].exec(["umount", SHARED_DIR])
    got = check_lines(proc.stdout)
    assert proc.returncode == 1
    assert got[("spark2", "shared_dir_owner")].startswith("FAIL")
    assert f"spark2: {SHARED_DIR} is owned by 0:0" in got[("spark2", "shared_dir_owner")]
    assert got[("spark1", "shared_dir_owner")].startswith("PASS")
    probe = got[("spark1->spark2", "shared_dir_cross_host_write_read")]
    assert probe.startswith("FAIL") and "the server host spark2 does not see the file the trainer host spark1 wrote" \
        in probe and "same share" in probe


def test_an_unknown_host_key_fails_that_host_only(spec, hosts):
    known = hosts.write_ssh_files(known=[hosts["spark1"]], path=hosts.dir / "known_hosts-spark1-only")
    config = hosts.config_for(known)
    proc = check(spec, hosts, "--", "-k", "docker_engine", ssh_config=config)
    got = check_lines(proc.stdout)
    assert proc.returncode == 1
    assert got[("spark1", "docker_engine_answers")].startswith("PASS")
    line = got[("spark2", "docker_engine_answers")]
    assert line.startswith("FAIL") and "spark2: unknown host key" in line and "ssh-keyscan" in line
