"""grpo_deploy.runtime.verl.ray_cluster: the head's verdict on the cluster before verl starts (nodes, GPUs, CPUs per
GPU, each with the numbers on both sides), and the wait for workers to join."""

from __future__ import annotations

from grpo_deploy.runtime.verl import ray_cluster
from grpo_deploy.runtime.verl.ray_cluster import ClusterWant, Node

WANT = ClusterWant(nodes=2, gpus_per_node=1)


def record(ip: str, gpus: float, cpus: float, alive: bool = True) -> dict:
    return {"Alive": alive, "NodeManagerAddress": ip, "Resources": {"GPU": gpus, "CPU": cpus, "memory": 1e9}}


def test_alive_nodes_skip_dead_ones_and_read_gpus_and_cpus():
    nodes = ray_cluster.alive_nodes([record("10.0.0.2", 1, 8), record("10.0.0.1", 1, 8), record("10.0.0.3", 1, 8,
                                                                                                  alive=False),
                                     {"Alive": True, "NodeManagerAddress": "10.0.0.4", "Resources": {"CPU": 4}}])
    assert [n.ip for n in nodes] == ["10.0.0.1", "10.0.0.2", "10.0.0.4"] and nodes[2].gpus == 0


def test_the_spec_shape_passes():
    verdict = ray_cluster.judge([Node("10.0.0.1", 1, 8), Node("10.0.0.2", 1, 8)], WANT)
    assert verdict.ok and verdict.counts() == {"nodes": 2, "gpus": 2, "cpus": 16,
                                               "node_ips": ["10.0.0.1", "10.0.0.2"]}


def test_a_worker_that_did_not_join_is_named_with_the_numbers():
    verdict = ray_cluster.judge([Node("10.0.0.1", 1, 8)], WANT)
    assert not verdict.ok
    assert "Ray reports 1 node(s), 1 GPU(s), 8 CPU(s)" in verdict.message
    assert "exactly 2 node(s) x 1 GPU(s) = 2 GPU(s)" in verdict.message and "did not join" in verdict.message


def test_fewer_gpus_than_the_spec_names_the_node():
    verdict = ray_cluster.judge([Node("10.0.0.1", 4, 24), Node("10.0.0.2", 2, 24)], ClusterWant(2, 4))
    assert not verdict.ok and "10.0.0.2 offer(s) fewer GPUs" in verdict.message and "6 GPU(s)" in verdict.message
    assert "n_gpus_per_node" in verdict.message


def test_too_few_cpus_per_gpu_and_too_many_nodes():
    starved = ray_cluster.judge([Node("10.0.0.1", 4, 24), Node("10.0.0.2", 4, 8)], ClusterWant(2, 4))
    assert not starved.ok and "10.0.0.2 offer(s) too few CPUs" in starved.message
    extra = ray_cluster.judge([Node(f"10.0.0.{i}", 1, 8) for i in (1, 2, 3)], WANT)
    assert not extra.ok and "1 node(s) too many" in extra.message


def test_wait_returns_once_every_node_joined_and_reports_each_change():
    seen = [[Node("10.0.0.1", 1, 8)], [Node("10.0.0.1", 1, 8)], [Node("10.0.0.1", 1, 8), Node("10.0.0.2", 1, 8)]]
    changes, now = [], [0.0]
    verdict = ray_cluster.wait_for(lambda: seen.pop(0), WANT, timeout_s=60, on_change=changes.append,
                                   clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert verdict.ok and [len(c) for c in changes] == [1, 2] and now[0] == 2.0


def test_wait_gives_up_at_the_deadline_with_what_is_there():
    now = [0.0]
    verdict = ray_cluster.wait_for(lambda: [Node("10.0.0.1", 1, 8)], WANT, timeout_s=5,
                                   clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert not verdict.ok and "did not join" in verdict.message and now[0] == 5.0
