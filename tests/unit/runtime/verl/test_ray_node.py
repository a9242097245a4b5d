"""grpo_deploy.runtime.verl.ray_node: `ray start` for a head and a worker (fixed ports only across hosts, resources left
to Ray when 0), the NCCL/Gloo interface of a node, and the cluster's token on the share."""

from __future__ import annotations

import os
import stat

import pytest

from grpo_deploy.runtime.verl import ray_node
from grpo_deploy.runtime.verl.ray_node import NodeArgs


def test_head_arguments_leave_zero_to_ray_and_fix_no_port_on_one_host():
    argv = ray_node.start_argv(NodeArgs("head", num_cpus=8, num_gpus=1))
    assert argv[:3] == ["ray", "start", "--disable-usage-stats"] and "--head" in argv
    assert argv[argv.index("--num-cpus") + 1] == "8" and argv[argv.index("--num-gpus") + 1] == "1"
    assert "--object-store-memory" not in argv and "--node-manager-port" not in argv
    assert "--node-ip-address" not in argv and "--block" not in argv
    bare = ray_node.start_argv(NodeArgs("head"))
    assert "--num-cpus" not in bare and "--num-gpus" not in bare


def test_a_worker_joins_the_head_on_its_address_with_fixed_ports():
    argv = ray_node.start_argv(NodeArgs("worker", head="10.0.0.1:6379", node_ip="10.0.0.2", num_gpus=2,
                                        cluster=True))
    assert "--head" not in argv and argv[argv.index("--address") + 1] == "10.0.0.1:6379" and "--block" in argv
    assert argv[argv.index("--node-ip-address") + 1] == "10.0.0.2"
    for flag, port in ray_node.NODE_PORTS.items():
        assert argv[argv.index(flag) + 1] == str(port)
    assert argv[argv.index("--min-worker-port") + 1] == str(ray_node.WORKER_PORTS[0])
    assert ray_node.GCS_PORT not in ray_node.NODE_PORTS.values()


def test_socket_interface_named_or_found_from_the_node_address():
    addresses = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.2"], "docker0": ["172.17.0.1"]}
    found = ray_node.socket_env(NodeArgs("worker", node_ip="10.0.0.2", cluster=True), addresses)
    assert found == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
    named = ray_node.socket_env(NodeArgs("worker", node_ip="10.0.0.2", ifname="docker0", cluster=True), addresses)
    assert named["GLOO_SOCKET_IFNAME"] == "docker0"
    assert ray_node.socket_env(NodeArgs("head"), addresses) == {}  # one host: loopback, nothing to say
    with pytest.raises(SystemExit, match="no network interface named ib0 .*docker0, eth0, lo.*hosts\\[\\].interface"):
        ray_node.socket_env(NodeArgs("worker", node_ip="10.0.0.2", ifname="ib0", cluster=True), addresses)
    with pytest.raises(SystemExit, match="holds 10.9.9.9"):
        ray_node.socket_env(NodeArgs("worker", node_ip="10.9.9.9", cluster=True), addresses)


def test_the_token_is_made_once_by_the_head_private_and_never_through_a_link(tmp_path):
    path = tmp_path / "run" / ray_node.TOKEN_NAME
    with pytest.raises(SystemExit, match="missing"):
        ray_node.ensure_token(path, create=False)  # a worker never makes one
    ray_node.ensure_token(path, create=True)
    token = path.read_text()
    assert len(token) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ray_node.ensure_token(path, create=True).read_text() == token  # kept, not replaced
    assert ray_node.ensure_token(path, create=False) == path
    link = tmp_path / "link-token"
    os.symlink(tmp_path / "target", link)
    for create in (True, False):
        with pytest.raises(SystemExit, match="not a regular file"):
            ray_node.ensure_token(link, create=create)
    assert not (tmp_path / "target").exists()


def test_ray_env_names_the_token_file_never_its_value(tmp_path):
    path = tmp_path / ray_node.TOKEN_NAME
    ray_node.ensure_token(path, create=True)
    env = ray_node.ray_env(path, "10.0.0.1:6379")
    assert env == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path), "RAY_ADDRESS": "10.0.0.1:6379"}
    assert path.read_text() not in " ".join(env.values())
