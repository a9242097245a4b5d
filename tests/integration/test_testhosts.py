"""The test hosts themselves (tests/testhosts.py): each answers real SSH with only the generated ssh_config, known_hosts
and key, runs its own Docker engine and Compose v2 for the login user, shares one directory with the others at the
same path, refuses a client that does not know its host key, and is gone after the block (its docker volume kept)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from tests.testhosts import BASE_IMAGE, LOGIN_USER, SHARED_DIR, SMALL_DIR, TestHosts, test_hosts

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    start = time.monotonic()
    with test_hosts(2, tmp_path_factory.mktemp("hosts")) as th:
        print(f"\n[test_testhosts] bring-up of 2 hosts (image ready): {time.monotonic() - start:.1f} s")
        yield th


def connect(ssh_config: Path, alias: str, known_hosts: Path | None = None) -> paramiko.SSHClient:
    """What the deployer does: everything from the ssh_config; an unknown host key is refused."""
    cfg = paramiko.SSHConfig.from_path(str(ssh_config)).lookup(alias)
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts or cfg["userknownhostsfile"]))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(cfg["hostname"], port=int(cfg.get("port", 22)), username=cfg["user"],
                       key_filename=cfg["identityfile"], timeout=10, allow_agent=False, look_for_keys=False)
    except BaseException:
        client.close()
        raise
    return client


def run(client: paramiko.SSHClient, command: str) -> str:
    _, out, err = client.exec_command(command, timeout=60)
    text, status = out.read().decode(), out.channel.recv_exit_status()
    assert status == 0, f"{command!r} exit {status}: {err.read().decode()}"
    return text.strip()


def test_ssh_config_names_each_host_and_nothing_else(hosts: TestHosts):
    text = hosts.ssh_config.read_text()
    for host in hosts:
        cfg = paramiko.SSHConfig.from_path(str(hosts.ssh_config)).lookup(host.name)
        assert cfg["hostname"] == host.ip and cfg["user"] == LOGIN_USER
        assert cfg["identityfile"] == [str(hosts.key)] and cfg["stricthostkeychecking"] == "yes"
        assert cfg["userknownhostsfile"] == str(hosts.known_hosts)
    assert text.count("Host ") == 2 and len({h.ip for h in hosts}) == 2
    assert hosts.shared_dir == SHARED_DIR


@pytest.mark.parametrize("alias", ["spark1", "spark2"])
def test_each_host_answers_ssh_with_its_own_engine_and_compose(hosts: TestHosts, alias: str):
    client = connect(hosts.ssh_config, alias)
    try:
        assert run(client, "id -un") == LOGIN_USER and run(client, "id -u") == "1500"
        assert run(client, "hostname") == alias
        assert run(client, "uname -m") == os.uname().machine
        version = run(client, "docker info --format {{.ServerVersion}}")
        assert version.startswith("20.10"), version
        assert "Docker Compose version" in run(client, "docker compose version")
        engine_id = run(client, "docker info --format {{.ID}}")
    finally:
        client.close()
    other = next(h for h in hosts if h.name != alias)
    assert engine_id != other.exec(["docker", "info", "--format", "{{.ID}}"]).strip()  # not one engine seen twice
    print(f"\n[test_testhosts] {alias}: docker {version}, {hosts[alias].ip}")


def test_shared_dir_is_one_directory_with_the_same_owner(hosts: TestHosts):
    for host in hosts:
        assert host.exec(["stat", "-c", "%u:%g", SHARED_DIR]).strip() == "1000:1000"
    name = f"{SHARED_DIR}/written-on-spark1-{os.getpid()}"
    hosts["spark1"].exec(["sh", "-c", f"echo hello from spark1 > {name}"], user="1000:1000")
    assert hosts["spark2"].exec(["stat", "-c", "%u:%g", name]).strip() == "1000:1000"
    assert hosts["spark2"].exec(["cat", name], user="1000:1000") == "hello from spark1\n"
    # ... while the rest of each filesystem is the host's own
    hosts["spark1"].exec(["touch", "/srv/only-on-spark1"])
    assert hosts["spark2"].exec(["test", "-e", "/srv/only-on-spark1"], check=False) == ""
    with pytest.raises(RuntimeError):
        hosts["spark2"].exec(["test", "-e", "/srv/only-on-spark1"])


def test_client_that_does_not_know_a_host_key_is_refused(hosts: TestHosts, tmp_path: Path):
    partial = hosts.write_ssh_files(known=[hosts["spark1"]], path=tmp_path / "known_spark1_only")
    config = hosts.config_for(partial)
    connect(config, "spark1").close()
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(config, "spark2")
    # a known_hosts that holds another key for spark2 (spark1's) is refused too
    wrong = tmp_path / "known_wrong"
    wrong.write_text(f"{hosts['spark2'].ip} {hosts['spark1'].host_key}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        connect(config, "spark2", known_hosts=wrong)


def test_has_image_sees_an_image_shipped_into_one_host(hosts: TestHosts):
    probe = f"grpo-deploy/testhost-probe:{os.getpid()}"
    subprocess.run(["docker", "tag", BASE_IMAGE, probe], check=True)
    try:
        local = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", probe], check=True,
                               capture_output=True, text=True).stdout.strip()
        assert hosts["spark1"].has_image(probe) is None
        start = time.monotonic()
        save = subprocess.run(["docker", "save", probe], check=True, capture_output=True).stdout
        hosts["spark1"].exec(["docker", "load", "-q"], stdin=save)
        print(f"\n[test_testhosts] shipped {len(save) / 1e6:.0f} MB into spark1 in {time.monotonic() - start:.1f} s")
        assert hosts["spark1"].has_image(probe) == local
        assert hosts["spark2"].has_image(probe) is None
    finally:
        subprocess.run(["docker", "rmi", probe], capture_output=True)
        for host in hosts:
            host.exec(["docker", "rmi", probe], check=False)


def _exists(kind: str, name: str) -> bool:
    return subprocess.run(["docker", kind, "inspect", name], capture_output=True).returncode == 0


def test_teardown_on_interrupt_keeps_only_the_docker_volume(tmp_path: Path):
    """A KeyboardInterrupt inside the block: containers and network go, the engine's volume stays, and an image made
    in the host is there at the next bring-up. Also the small tmpfs and fresh=True, on a volume of the test's own so
    no other test's kept images are touched."""
    prefix = f"grpo-testhost-selftest{os.getpid()}"
    try:
        with pytest.raises(KeyboardInterrupt):
            with test_hosts(1, tmp_path, small_disk={"spark1": "16m"}, fresh=True, volume_prefix=prefix) as th:
                host = th["spark1"]
                assert host.exec(["df", "-B1", "--output=size", SMALL_DIR]).split()[-1] == str(16 * 1024 * 1024)
                assert host.exec(["stat", "-c", "%u:%g", SMALL_DIR]).strip() == "1000:1000"
                assert host.exec(["docker", "images", "-q"]).strip() == ""  # fresh: an empty engine
                host.exec(["sh", "-c", "tar cf - -T /dev/null | docker import - grpo-deploy/probe:kept"])
                probe = host.has_image("grpo-deploy/probe:kept")
                container, network, volume = host.container, th.network, host.volume
                assert probe and _exists("container", container) and _exists("network", network)
                raise KeyboardInterrupt
        assert not _exists("container", container) and not _exists("network", network)
        assert _exists("volume", volume) and host.volume_kept
        with test_hosts(1, tmp_path, volume_prefix=prefix) as th:
            assert th["spark1"].has_image("grpo-deploy/probe:kept") == probe
    finally:
        subprocess.run(["docker", "volume", "rm", f"{prefix}-spark1-docker"], capture_output=True)


@pytest.mark.slow
def test_eight_hosts_each_answer_ssh(tmp_path: Path):
    """The most hosts the deployer supports, at once; prints bring-up time and what each host costs in memory."""
    prefix = f"grpo-testhost-eight{os.getpid()}"
    try:
        with test_hosts(8, tmp_path, volume_prefix=prefix) as th:
            assert len({h.ip for h in th}) == 8
            for host in th:
                client = connect(th.ssh_config, host.name)
                try:
                    assert run(client, "hostname") == host.name
                    assert run(client, "docker info --format {{.ServerVersion}}").startswith("20.10")
                finally:
                    client.close()
            stats = subprocess.run(["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}",
                                    *(h.container for h in th)], capture_output=True, text=True).stdout.split("\n")
            print(f"\n[test_testhosts] 8 hosts up in {th.bringup_s:.1f} s; memory each: "
                  + ", ".join(line.split(" / ")[0] for line in stats if line))
    finally:
        for i in range(1, 9):
            subprocess.run(["docker", "volume", "rm", f"{prefix}-spark{i}-docker"], capture_output=True)
