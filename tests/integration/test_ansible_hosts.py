"""ansible/site.yml run for real, over SSH, against two test hosts (tests/testhosts.py: containers with their own sshd
and Docker engine, one host directory mounted at /srv/grpo-shared in both): spark1 is Ubuntu 24.04 (noble), spark2
Debian 12 (bookworm); then checked with the kit's own testinfra suite (`grpo-deploy check`).

- Every role of the play runs on both OSes in the one converge: both hosts are run hosts (spark1 the trainer, spark2
  the server), in spark_link and in nfs_server (each exports; the clients mount the first), so no second converge
  with the roles swapped is needed.
- The hosts are the deployer's test hosts plus sudo for the login user (Ansible's become): an image per OS built FROM
  that OS's test-host image (itself FROM the kit's debootstrap base: `grpo-deploy images base [--suite noble]`,
  built when missing), kept by the hash of its inputs. They run on their own network with their own kept engine
  volumes (grpo-ansiblehost-<name>-docker), so other test sessions' hosts are never touched.
- What a container cannot run is skipped by the play's named conditions, not by the test: grpo_nfs_kernel is false
  there (no kernel NFS server or client: the export directory and its export line are written, exportfs, the service
  and the mount are not), grpo_has_gpu is false (no NVIDIA toolkit), spark_link_applicable is false (no netplan, no
  CX-7 interfaces). The Docker engine is present and is kept (no package is installed from the network).
- The play converges (changes on the first run), a second run reports changed=0, the kit's preflight (the play's last
  play) passes, and `grpo-deploy check` passes, on both hosts; then hosts broken on purpose fail the named checks of
  `grpo-deploy check` on each OS: the shared directory chowned to root (both hosts), the login user dropped from the
  docker group on the Debian host (the Ubuntu host's check passes; the play's preflight names the Debian host), then
  the same on the Ubuntu host with the Debian host repaired (a full run repairs both: the converge above shows the
  play sets them; not repeated here, to keep the test's run time down).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from tests.check_output import check_lines
from tests.testhosts import LOGIN_USER, SHARED_DIR, _docker, host_image, test_hosts, two_host_spec

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
IMAGE_REPO = "grpo-deploy/testhost-ansible"
EXPORT_DIR = "/srv/grpo-export"
SOCKET = "/var/run/docker.sock"
RUN_UID = 1000
HOST_OS = {"spark1": "ubuntu", "spark2": "debian"}  # the os-release ID of each test host
OS_SHOWN = {"ubuntu": r"Ubuntu 24\.04", "debian": r"Debian 12"}  # as Ansible's facts name them (a regex)
HOST_CHECKS = ("shared_dir_present", "shared_dir_owner", "shared_dir_mode", "login_user_can_use_docker",
               "docker_engine_answers", "compose_v2_answers", "checkpoint_disk_headroom")


def ansible_host_image(os_name: str) -> str:
    """*os_name*'s test-host image plus sudo (no password) for the login user; built once per input hash."""
    base = host_image(os_name=os_name)
    dockerfile = (f"FROM {base}\n"
                  "RUN apt-get update -qq \\\n"
                  " && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends sudo \\\n"
                  " && rm -rf /var/lib/apt/lists/* \\\n"
                  f" && echo '{LOGIN_USER} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{LOGIN_USER} \\\n"
                  f" && chmod 0440 /etc/sudoers.d/{LOGIN_USER} && visudo -cq\n")
    tag = f"{IMAGE_REPO}:{hashlib.sha256(dockerfile.encode()).hexdigest()[:12]}"
    if _docker("image", "ls", "-q", tag).strip():
        return tag
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    start = time.monotonic()
    _docker("build", "-q", "-t", tag, "-", stdin=buf.getvalue(), timeout=600)
    print(f"[ansible hosts] built {tag} in {time.monotonic() - start:.1f} s")
    return tag


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    images = {name: ansible_host_image(os_name) for name, os_name in HOST_OS.items()}
    # fresh: the play puts no image in the hosts' engines, and an engine volume last written by the other OS's
    # dockerd (another Docker version) is not reused
    with test_hosts(2, tmp_path_factory.mktemp("ansiblehosts"), image=images, volume_prefix="grpo-ansiblehost",
                    fresh=True) as th:
        yield th


@pytest.fixture(scope="module")
def spec(hosts, tmp_path_factory) -> Path:
    """The two-host cpu spec (testhosts.two_host_spec)."""
    return two_host_spec(tmp_path_factory.mktemp("ansiblespec"))


@pytest.fixture(scope="module")
def inventory(hosts, tmp_path_factory) -> Path:
    data = {"all": {
        "vars": {"ansible_user": LOGIN_USER, "ansible_ssh_common_args": f"-F {hosts.ssh_config}",
                 "ansible_python_interpreter": "/usr/bin/python3", "run_user_uid": RUN_UID, "run_user_gid": RUN_UID,
                 "shared_dir_path": SHARED_DIR, "nfs_server_export_path": EXPORT_DIR, "docker_users": [LOGIN_USER]},
        "children": {
            "run_hosts": {"children": {"trainers": {"hosts": {"spark1": {"spark_link_host_id": 1}}},
                                       "servers": {"hosts": {"spark2": {"spark_link_host_id": 2}}}}},
            "spark_link": {"hosts": {"spark1": None, "spark2": None},
                           "vars": {"spark_link_ports": [{"interface": "enp1s0f1np1", "subnet": "192.168.100.0/24"}]}},
            # Both export, so the nfs_server role runs on both OSes; the clients mount the first (spark1).
            "nfs_server": {"hosts": {"spark1": None, "spark2": None},
                           "vars": {"nfs_server_clients": ["spark1", "spark2"]}},
        }}}
    path = tmp_path_factory.mktemp("ansibleinv") / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def play(inventory: Path, spec: Path, hosts, *extra: str) -> subprocess.CompletedProcess:
    extra_vars = {"preflight_spec": str(spec), "preflight_ssh_config": str(hosts.ssh_config),
                  "preflight_command": [sys.executable, "-m", "grpo_deploy.cli"]}
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PYTHONPATH": str(ROOT),
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(hosts.dir / "cp"), "ANSIBLE_HOST_KEY_CHECKING": "True",
           "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_PIPELINING": "True"}
    start = time.monotonic()
    proc = subprocess.run(["ansible-playbook", "-i", str(inventory), str(ANSIBLE / "site.yml"),
                           "-e", json.dumps(extra_vars), *extra],
                          capture_output=True, text=True, timeout=600, env=env, cwd=hosts.dir)
    took = time.monotonic() - start
    print(f"$ ansible-playbook site.yml {' '.join(extra)} -> exit {proc.returncode} in {took:.1f} s")
    print(proc.stdout[-5000:], proc.stderr[-2000:])
    return proc


def recap(out: str) -> dict[str, dict[str, int]]:
    """{host: {ok, changed, failed, ...}} from the PLAY RECAP."""
    found = {}
    for host, counts in re.findall(r"^(\S+)\s*:\s*(ok=.*)$", out.split("PLAY RECAP")[-1], re.M):
        found[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
    assert found, out
    return found


def check(spec: Path, hosts) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "check", "-f", str(spec), "--ssh-config",
                           str(hosts.ssh_config)], capture_output=True, text=True, timeout=600, cwd=spec.parent,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(f"$ grpo-deploy check -> exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    return proc


def os_release(host) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in host.exec(["cat", "/etc/os-release"]).splitlines() if "=" in line)
    return {k: v.strip('"') for k, v in pairs}


def test_site_converges_is_idempotent_and_passes_check(hosts, inventory, spec):
    for host in hosts:  # what the play must create is not there before it runs, on the OS the test says
        assert os_release(host)["ID"] == HOST_OS[host.name], os_release(host)
        assert host.exec(["getent", "passwd", str(RUN_UID)], check=False) == ""
    first = play(inventory, spec, hosts)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr
    counts = recap(first.stdout)
    # user, group, shared dir, export dir and line on each
    assert counts["spark1"]["changed"] >= 4 and counts["spark2"]["changed"] >= 4, counts
    assert counts["localhost"]["failed"] == 0 and "grpo-deploy preflight:" in first.stdout, first.stdout[-3000:]
    # The named conditions held on each OS, and what a container cannot run was skipped by them.
    for name, os_name in HOST_OS.items():
        shown = (rf"ok: \[{name}\] => {{\s*\"msg\": \"grpo_has_gpu=False grpo_nfs_kernel=False "
                 rf"\(detected; {OS_SHOWN[os_name]}\b")
        assert re.search(shown, first.stdout), (name, first.stdout[-6000:])
        assert f"spark_link_applicable is false on {name}: no /usr/sbin/netplan" in first.stdout
    assert "Install the Docker engine (none installed)" in first.stdout  # the task ran, and skipped: docker.io is there
    for host in hosts:
        assert host.exec(["getent", "passwd", str(RUN_UID)]).split(":")[:4] == ["grpo", "x", str(RUN_UID), str(RUN_UID)]
        assert host.exec(["stat", "-c", "%u:%g %a", SHARED_DIR]).strip() == f"{RUN_UID}:{RUN_UID} 775"
        assert host.exec(["sh", "-c", "test -e /etc/netplan/40-grpo-spark-link.yaml && echo written || echo absent"]
                         ).strip() == "absent"
        assert host.exec(["stat", "-c", "%u:%g %a", EXPORT_DIR]).strip() == f"{RUN_UID}:{RUN_UID} 775", host.name
        export = host.exec(["cat", "/etc/exports.d/grpo-deploy.exports"]).splitlines()[-1]
        assert export == (f"{EXPORT_DIR} spark1(rw,sync,no_subtree_check,root_squash) "
                          "spark2(rw,sync,no_subtree_check,root_squash)"), (host.name, export)

    second = play(inventory, spec, hosts)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr
    counts = recap(second.stdout)
    assert set(counts) == {"spark1", "spark2", "localhost"}, counts
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), counts

    proc = check(spec, hosts)
    got = check_lines(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in HOST_CHECKS:
        assert got[("spark1", name)].startswith("PASS") and got[("spark2", name)].startswith("PASS"), name


def test_broken_hosts_fail_named_checks_on_each_os(hosts, inventory, spec):
    ubuntu, debian = hosts["spark1"], hosts["spark2"]
    debian.exec(["chown", "0:0", SHARED_DIR])  # one directory behind both hosts: both see it
    debian.exec(["gpasswd", "-d", LOGIN_USER, "docker"])
    assert ubuntu.exec(["stat", "-c", "%u:%g", SHARED_DIR]).strip() == "0:0"  # the same directory behind spark1
    proc = check(spec, hosts)
    got = check_lines(proc.stdout)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for name in ("spark1", "spark2"):
        assert got[(name, "shared_dir_owner")].startswith("FAIL"), got
        assert f"{SHARED_DIR} is owned by 0:0; the run runs as {RUN_UID}:{RUN_UID}" in got[(name, "shared_dir_owner")]
        assert got[(name, "shared_dir_present")].startswith("PASS"), got
    assert got[("spark2", "login_user_can_use_docker")].startswith("FAIL"), got
    assert f"the login user {LOGIN_USER} cannot use {SOCKET}" in got[("spark2", "login_user_can_use_docker")]
    assert got[("spark1", "login_user_can_use_docker")].startswith("PASS"), got

    # The play's preflight (the kit's own checks, run by the preflight role) fails on it too, naming check and host.
    pre = play(inventory, spec, hosts, "--tags", "preflight")
    assert pre.returncode != 0, pre.stdout
    failed = re.search(r"grpo-deploy preflight failed: docker on spark2: no Docker engine answers", pre.stdout)
    assert failed, pre.stdout
    assert "docker on spark1" not in pre.stdout

    # The same break on the Ubuntu host, the Debian host repaired: now only spark1 fails it.
    debian.exec(["gpasswd", "-a", LOGIN_USER, "docker"])
    ubuntu.exec(["gpasswd", "-d", LOGIN_USER, "docker"])
    proc = check(spec, hosts)
    got = check_lines(proc.stdout)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert got[("spark1", "login_user_can_use_docker")].startswith("FAIL"), got
    assert f"the login user {LOGIN_USER} cannot use {SOCKET}" in got[("spark1", "login_user_can_use_docker")]
    assert got[("spark2", "login_user_can_use_docker")].startswith("PASS"), got
