"""The network interface NCCL and Gloo use between hosts (runtime/net.py): the interface named or holding a node's
address, a one-line refusal when neither is on the host, and this host's real IPv4 addresses by interface."""

from __future__ import annotations

import pytest

from grpo_deploy.runtime import net

HAVE = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.2", "10.0.0.3"], "docker0": ["172.17.0.1"]}


def test_the_interface_holding_an_address():
    assert net.interface_of("10.0.0.3", HAVE) == "eth0"
    assert net.interface_of("10.0.0.9", HAVE) is None
    assert net.interface_of("10.0.0.2", {"b": ["10.0.0.2"], "a": ["10.0.0.2"]}) == "a"  # the same answer every time


def test_the_named_interface_wins_over_the_node_address():
    assert net.socket_interface("docker0", "10.0.0.2", HAVE) == "docker0"
    assert net.socket_interface("", "10.0.0.2", HAVE) == "eth0"


@pytest.mark.parametrize(("ifname", "node_ip", "says"), [
    ("ib0", "10.0.0.2", "no network interface named ib0 on this host (it has docker0, eth0, lo)"),
    ("", "10.9.9.9", "no network interface holds 10.9.9.9 on this host"),
    ("eth0\n", "10.0.0.2", "named eth0\n"),  # a newline is no interface name
])
def test_an_interface_not_on_the_host_is_one_error_naming_the_fix(ifname, node_ip, says):
    with pytest.raises(ValueError, match="set hosts\\[\\].interface in the spec") as refused:
        net.socket_interface(ifname, node_ip, HAVE)
    assert says in str(refused.value)
    with pytest.raises(ValueError, match="it has none"):
        net.socket_interface("", "10.0.0.2", {})


def test_this_hosts_addresses_are_ipv4_by_interface():
    pytest.importorskip("psutil")
    found = net.local_addresses()
    assert found and all(isinstance(ips, list) for ips in found.values())
    assert all(ip.count(".") == 3 and ":" not in ip for ips in found.values() for ip in ips)
    loopback = net.interface_of("127.0.0.1", found)
    if loopback is not None:  # a network namespace with a loopback (nearly all)
        assert net.socket_interface("", "127.0.0.1") == loopback
