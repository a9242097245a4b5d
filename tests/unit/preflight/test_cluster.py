"""grpo_deploy.preflight.cluster over gathered facts (no host): each Ray node's address and interface (named, from the
spec's IP, from where SSH reached it), Ray's ports taken, InfiniBand on one side only, GPUs short of
n_gpus_per_node; each with the fix in the spec's own key. The network probe itself runs in the cluster test."""

from __future__ import annotations

from grpo_deploy import preflight, spec
from grpo_deploy.hosts.facts import Gpu
from grpo_deploy.preflight import cluster as cluster_checks
from grpo_deploy.spec import resolve
from tests.specs import spec_yaml

ETH = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.1"], "docker0": ["172.17.0.1"]}


def ctx_for(facts: dict, profile: str = "cpu", **changes) -> preflight.Context:
    text = spec_yaml(profile, "verl", ("node1", "node2"), **{"storage.nfs": None, "hosts.0.shared_dir": "/srv/s",
                                                             "hosts.1.shared_dir": "/srv/s", **changes})
    ctx = preflight.Context(resolve.resolve(spec.loads(text, source="spec.yaml")))
    ctx._facts = facts
    return ctx


def node(ip: str, **kw) -> dict:
    return {"interfaces": {"lo": ["127.0.0.1"], "eth0": [ip]}, "listening_ports": {22}, "infiniband": False,
            "reached_at": ip, "running": [], **kw}


def rows(ctx) -> dict:
    return {r.host: r for r in cluster_checks.check_cluster(ctx)}


def test_addresses_from_where_ssh_reached_each_host_and_the_interface_holding_it():
    ctx = ctx_for({"node1": node("10.0.0.1"), "node2": node("10.0.0.2")})
    got = rows(ctx)
    assert got["node1"].verdict == "ok" and "head at 10.0.0.1 on eth0" in got["node1"].fact
    assert got["node2"].verdict == "ok" and "worker at 10.0.0.2" in got["node2"].fact
    assert cluster_checks.node_addresses(ctx) == {"node1": cluster_checks.NodeAddress("10.0.0.1", "eth0"),
                                              "node2": cluster_checks.NodeAddress("10.0.0.2", "eth0")}


def test_a_named_interface_wins_and_one_that_does_not_exist_is_refused_with_what_there_is():
    facts = {"node1": node("10.0.0.1", interfaces=ETH | {"ib0": ["192.168.9.1"]}), "node2": node("10.0.0.2")}
    assert cluster_checks.node_addresses(ctx_for(facts, **{"hosts.0.interface": "ib0"}))["node1"].ip == "192.168.9.1"
    bad = rows(ctx_for(facts, **{"hosts.1.interface": "nosuch0"}))["node2"]
    assert bad.verdict == "fail" and "no network interface 'nosuch0' there (it has eth0, lo)" in bad.fact
    assert "hosts[1].interface" in bad.hint


def test_an_address_that_is_not_the_hosts_own_is_refused():
    got = rows(ctx_for({"node1": node("10.0.0.1"), "node2": node("10.0.0.2", reached_at="203.0.113.7")}))["node2"]
    assert got.verdict == "fail" and "203.0.113.7" in got.fact and "NAT" in got.fact
    unknown = rows(ctx_for({"node1": node("10.0.0.1"), "node2": node("10.0.0.2", reached_at=None)}))["node2"]
    assert unknown.verdict == "fail" and "hosts[1].interface" in unknown.hint


def test_rays_ports_taken_and_a_run_already_there_are_refused():
    taken = rows(ctx_for({"node1": node("10.0.0.1", listening_ports={22, 6379}), "node2": node("10.0.0.2")}))
    assert taken["node1"].verdict == "fail" and "6379" in taken["node1"].fact
    assert taken["node2"].verdict == "ok"  # no GCS on a worker: 6379 is the head's only
    worker_range = rows(ctx_for({"node1": node("10.0.0.1"), "node2": node("10.0.0.2", listening_ports={10500})}))
    assert worker_range["node2"].verdict == "fail" and "10500" in worker_range["node2"].fact
    running = rows(ctx_for({"node1": node("10.0.0.1"), "node2": node("10.0.0.2", running=["grpo-x-worker-1"])}))
    assert running["node2"].verdict == "fail" and "grpo-deploy down" in running["node2"].hint


def test_infiniband_on_the_host_must_reach_the_container_and_the_other_way_round():
    silent = rows(ctx_for({"node1": node("10.0.0.1", infiniband=True), "node2": node("10.0.0.2")}))["node1"]
    assert silent.verdict == "fail" and "fall back to TCP" in silent.fact
    assert silent.hint == "set hosts[0].infiniband: true"
    missing = rows(ctx_for({"node1": node("10.0.0.1"), "node2": node("10.0.0.2")}, **{"hosts.1.infiniband": True}))
    assert missing["node2"].verdict == "fail" and "no /dev/infiniband" in missing["node2"].fact


def test_a_gpu_host_with_fewer_gpus_than_n_gpus_per_node_is_refused():
    gpus = [Gpu("NVIDIA A100-SXM4-80GB", "8.0", 81920) for _ in range(2)]
    facts = {"node1": node("10.0.0.1", gpus=gpus * 2), "node2": node("10.0.0.2", gpus=gpus)}
    got = rows(ctx_for(facts, "a100"))
    assert got["node1"].verdict == "ok"
    assert got["node2"].verdict == "fail" and "2 GPU(s) there; trainer.n_gpus_per_node is 4" in got["node2"].fact


def test_one_host_has_no_cluster_to_check():
    text = spec_yaml("cpu", "verl", ())
    ctx = preflight.Context(resolve.resolve(spec.loads(text, source="spec.yaml")))
    assert [r.verdict for r in cluster_checks.check_cluster(ctx)] == ["skip"]
    assert [r.verdict for r in cluster_checks.check_cluster_reach(ctx)] == ["skip"]


def trainers_ctx(facts: dict, **changes) -> preflight.Context:
    """trl-async over two trainer hosts (node1: machine 0 and the server, node2: machine 1)."""
    text = spec_yaml("cpu", "trl-async", ("node1", "node2"), **{
        "storage.nfs": None, "hosts.0.shared_dir": "/srv/s", "hosts.1.shared_dir": "/srv/s",
        "hosts.0.roles": ["trainer", "server"], "hosts.1.roles": ["trainer"], **changes})
    ctx = preflight.Context(resolve.resolve(spec.loads(text, source="spec.yaml")))
    ctx._facts = facts
    return ctx


def test_trainer_hosts_are_a_cluster_whose_rendezvous_port_must_be_free_on_machine_0():
    ok = rows(trainers_ctx({"node1": node("10.0.0.1"), "node2": node("10.0.0.2", listening_ports={22, 6379})}))
    assert ok["node1"].verdict == "ok" and "trainer machine 0 (rendezvous) at 10.0.0.1 on eth0" in ok["node1"].fact
    assert ok["node2"].verdict == "ok"  # Ray's ports are not the trainer's business
    taken = rows(trainers_ctx({"node1": node("10.0.0.1", listening_ports={29500}), "node2": node("10.0.0.2")}))
    assert taken["node1"].verdict == "fail"
    assert "the trainer's rendezvous port(s) 29500 are taken there (it needs 29500)" in taken["node1"].fact
    bad = rows(trainers_ctx({"node1": node("10.0.0.1"), "node2": node("10.0.0.2")}, **{"hosts.1.interface": "ib9"}))
    assert bad["node2"].verdict == "fail" and "no network interface 'ib9'" in bad["node2"].fact
    found = cluster_checks.node_addresses(trainers_ctx({"node1": node("10.0.0.1"), "node2": node("10.0.0.2")}))
    assert found == {"node1": cluster_checks.NodeAddress("10.0.0.1", "eth0"),
                     "node2": cluster_checks.NodeAddress("10.0.0.2", "eth0")}


def test_one_trainer_host_has_no_cluster():
    text = spec_yaml("cpu", "trl-async", ("a", "b"), **{"storage.nfs": None, "hosts.0.shared_dir": "/s",
                                                        "hosts.1.shared_dir": "/s"})
    ctx = preflight.Context(resolve.resolve(spec.loads(text, source="spec.yaml")))
    assert [r.verdict for r in cluster_checks.check_cluster(ctx)] == ["skip"]
