"""The SSH connector (grpo_deploy.hosts.connect) against real test hosts: a host reached through a ProxyJump (the
target sees the jump host as its client), a jump host that does not answer (one line naming it), and output lines
streamed as they come (what `logs --follow` reads), on this machine and over SSH."""

from __future__ import annotations

import time

import pytest

from grpo_deploy.hosts.connect import HostError, LocalHost, SshHost, SshOptions
from tests.testhosts import test_hosts

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with test_hosts(2, tmp_path_factory.mktemp("hosts")) as th:
        yield th


def _with_jumps(hosts, tmp_path) -> str:
    """The test hosts' ssh_config plus: spark2 behind spark1, and a host behind a jump host that does not answer."""
    spark1, spark2 = hosts.hosts
    base = hosts.ssh_config.read_text()
    block = base.split("Host ")[2]  # spark2's entry: key, user, known_hosts
    jumped = "Host spark2-via-spark1\n" + block.split("\n", 1)[1].replace(
        "  BatchMode yes\n", f"  BatchMode yes\n  ProxyJump {spark1.name}\n")
    dead = ("Host dead-jump\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 3\n\n"
            "Host behind-dead-jump\n" + block.split("\n", 1)[1].replace(
                "  BatchMode yes\n", "  BatchMode yes\n  ProxyJump dead-jump\n"))
    path = tmp_path / "ssh_config"
    path.write_text(base + jumped + "\n" + dead)
    return str(path)


def test_proxyjump_reaches_the_target_through_the_jump_host(hosts, tmp_path):
    spark1, spark2 = hosts.hosts
    target = SshHost("spark2", "spark2-via-spark1", SshOptions(_with_jumps(hosts, tmp_path)))
    try:
        r = target.run(["sh", "-c", 'hostname; echo "$SSH_CONNECTION"'])
    finally:
        target.close()
    name, connection = r.out.strip().splitlines()
    assert r.ok and name == spark2.name
    assert connection.split()[0] == spark1.ip  # spark2 saw the jump host as its client, not this machine


def test_a_jump_host_that_does_not_answer_is_one_line_naming_it(hosts, tmp_path):
    target = SshHost("spark2", "behind-dead-jump", SshOptions(_with_jumps(hosts, tmp_path)))
    with pytest.raises(HostError) as info:
        target.run(["true"])
    target.close()
    message = str(info.value)
    assert "dead-jump" in message and "\n" not in message and "Traceback" not in message


@pytest.mark.parametrize("where", ["local", "ssh"])
def test_lines_arrive_as_they_are_written(hosts, where):
    host = LocalHost() if where == "local" else SshHost("spark1", "spark1", SshOptions(str(hosts.ssh_config)))
    script = "echo first; sleep 2; echo second >&2; sleep 30; echo never"
    seen = []
    start = time.monotonic()
    lines = host.lines(["sh", "-c", script])
    for line in lines:
        seen.append((line, time.monotonic() - start))
        if len(seen) == 2:
            break
    lines.close()  # stops the command: "never" is not waited for
    host.close()
    assert [text for text, _ in seen] == ["first", "second"]  # stdout and stderr, in order
    assert seen[0][1] < 1.9 <= seen[1][1] < 20  # the first line came before the second was written
