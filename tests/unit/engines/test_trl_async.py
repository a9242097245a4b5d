"""Tests of grpo_deploy.engines.trl_async (the TRL_ASYNC engine): the files it renders for a run, the ports each
host's vLLM replicas publish, when its trainer group spans hosts."""

from grpo_deploy import spec
from grpo_deploy.engines import TRL_ASYNC
from grpo_deploy.spec import resolve
from tests.specs import spec_yaml


def _res(profile: str = "cpu", hosts: tuple[str, ...] = (), **changes):
    return resolve.resolve(spec.loads(spec_yaml(profile, "trl-async", hosts, **changes), source="s.yaml"))


def test_one_replica_renders_the_server_and_trainer_config_and_no_proxy():
    files = TRL_ASYNC.config_files(_res())
    assert set(files) == {"config/server.args", "config/server.env", "config/trainer.env", "config/trainer.yaml"}
    assert "grpo_deploy.runtime.trainer.train" in files["config/trainer.yaml"]
    assert "--port\n8000" in files["config/server.args"] or "--port 8000" in files["config/server.args"]


def test_each_replica_publishes_the_next_port_and_only_server_hosts_publish():
    res = _res()
    host = res.spec.hosts[0]
    assert TRL_ASYNC.published_ports(res, host) == [res.settings.vllm.port]
    trainer_only = _res("gb10", ("s1", "s2"))
    ports = {h.name: TRL_ASYNC.published_ports(trainer_only, h) for h in trainer_only.spec.hosts}
    assert sorted(ports.values(), key=len) == [[], [trainer_only.settings.vllm.port]], ports


def test_the_trainer_group_spans_hosts_only_with_several_trainer_hosts():
    assert not TRL_ASYNC.spans_hosts(_res().spec) and TRL_ASYNC.cluster_ports(_res()) is None
    assert TRL_ASYNC.trainer_processes(_res()) == 1
