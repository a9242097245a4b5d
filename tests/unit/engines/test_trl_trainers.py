"""Tests of the trl-async engine's trainer processes (grpo_deploy.engines.trl_trainers: runtime.trainer_processes, one
per trainer GPU by default on cuda, any count on cpu, in trainer.yaml as `processes`)."""

import pytest
import yaml

from grpo_deploy import render, spec
from grpo_deploy.engines.trl_trainers import trainer_processes
from grpo_deploy.spec import resolve
from tests.specs import spec_yaml


def _res(profile="cpu", hosts=("a",), **changes):
    return resolve.resolve(spec.loads(spec_yaml(profile, "trl-async", hosts, **changes), source="s.yaml"))


def _trainer_yaml(res) -> dict:
    return yaml.safe_load(render.render_files(res)["config/trainer.yaml"])


def test_one_process_keeps_today_s_trainer_config():
    res = _res()
    assert trainer_processes(res) == 1 and "processes" not in _trainer_yaml(res)


def test_cpu_takes_any_count_and_says_it_in_the_trainer_config():
    res = _res(**{"overrides.runtime": {"trainer_processes": 2}})
    assert trainer_processes(res) == 2 and _trainer_yaml(res)["processes"] == 2


def test_cuda_defaults_to_one_process_and_takes_up_to_one_per_trainer_gpu():
    """Not yet run on GPUs here, so several processes are asked for, not assumed (HF's shape: 2 trainer GPUs)."""
    res = _res("h200", ("t", "s"))
    assert trainer_processes(res) == 1 and "processes" not in _trainer_yaml(res)
    two = _res("h200", ("t", "s"), **{"overrides.runtime": {"trainer_processes": 2}})
    assert trainer_processes(two) == 2 and _trainer_yaml(two)["processes"] == 2
    assert trainer_processes(_res("gb10", ("t", "s"))) == 1


def test_cuda_refuses_more_processes_than_trainer_gpus():
    with pytest.raises(spec.SpecError, match=r"overrides\.runtime\.trainer_processes: .* is 3 but the trainer on t has "
                                             r"2 GPU\(s\) \(\[0, 1\]\): FSDP2 runs one process per GPU; set it to 2 "
                                             r"or fewer"):
        _res("h200", ("t", "s"), **{"overrides.runtime": {"trainer_processes": 3}})
    with pytest.raises(spec.SpecError, match=r"is 2 but the trainer on a has 1 GPU\(s\)"):
        _res("h200", **{"overrides.runtime": {"trainer_processes": 2}})  # one host: the server on 0, the trainer on 1


@pytest.mark.parametrize("value", [0, -1, 65, "2", True, 2.0, 10**30])
def test_hostile_counts_are_refused_at_the_door(value):
    with pytest.raises(spec.SpecError, match=r"overrides\.runtime\.trainer_processes"):
        _res(**{"overrides.runtime": {"trainer_processes": value}})


def test_plan_shows_the_trainer_processes_beside_its_gpus():
    res = _res("h200", ("t", "s"), **{"hosts.1.replicas": 2,  # HF's recipe: 2 trainer GPUs + 2 replicas
                                      "overrides.runtime": {"trainer_processes": 2}})
    trainer, server = res.spec.hosts
    assert res.engine_info.gpu_words(res, trainer) == "trainer 0,1 (2 trainer processes, FSDP2)"
    assert res.engine_info.gpu_words(res, server) == "server 0; server-2 1"
    cpu = _res(**{"overrides.runtime": {"trainer_processes": 3}})
    assert cpu.engine_info.gpu_words(cpu, cpu.spec.hosts[0]).endswith("(3 trainer processes, FSDP2)")


def test_diagnose_names_the_next_trainer_process_from_the_spec():
    """A trainer-bound run (the Spark baseline's recorded stream) on cpu with 2 processes: the last knob is a third."""
    from pathlib import Path

    from grpo_deploy.common.metrics import read_events

    events = read_events(str(Path(__file__).parents[1] / "metrics" / "spark_trainer_bound.jsonl"))
    res = _res(**{"overrides.runtime": {"trainer_processes": 2}})
    found, _labels = res.engine_info.diagnose(events, res)
    assert found.side == "trainer-bound"
    assert (found.next_knobs[-1].setting, found.next_knobs[-1].value) == ("overrides.runtime.trainer_processes", "3")


# ---------------------------------------------------------------- a trainer over several trainer hosts

def _env(files: dict, host: str) -> dict:
    return dict(line.split("=", 1) for line in files[f"hosts/{host}.env"].splitlines() if line and line[0] != "#")


def test_two_trainer_hosts_are_one_group_machine_0_first_on_the_host_network():
    """spark1 runs the server and machine 0; spark2 machine 1 (each its host's address, as the deployer found it)."""
    res = _res("cpu", ("spark1", "spark2"), **{"hosts.0.roles": ["trainer", "server"], "hosts.1.roles": ["trainer"]})
    files = render.render_files(res, publish_ips={"spark1": "10.0.0.1", "spark2": "10.0.0.2"})
    config = yaml.safe_load(files["config/trainer.yaml"])
    assert config["machines"] == 2 and "processes" not in config
    assert config["async_grpo"]["vllm_server_base_url"] == "http://127.0.0.1:8000"  # machine 0 on the host network
    first, second = _env(files, "spark1"), _env(files, "spark2")
    for k, env in enumerate((first, second)):
        assert env["COMPOSE_FILE"].split(":")[-1] == "compose.trainer-hosts.yaml"
        assert (env["GRPO_MACHINE_RANK"], env["GRPO_MAIN_ADDRESS"], env["GRPO_MAIN_PORT"]) == (str(k), "10.0.0.1",
                                                                                             "29500")
    assert (first["GRPO_NODE_IP"], second["GRPO_NODE_IP"]) == ("10.0.0.1", "10.0.0.2")
    assert first["GRPO_SERVER_PUBLISH"] == "127.0.0.1"  # the server beside machine 0: loopback only
    assert [h.name for h in res.engine_info.cluster_nodes(res)] == ["spark1", "spark2"]
    assert res.engine_info.cluster_ports(res).first == (29500,) and res.engine_info.trainer_processes(res) == 2


def test_seed_004s_next_experiment_two_training_sparks_and_one_serving():
    """gb10: two trainer hosts (one GPU process each) and a server host; the server publishes on its own address,
    where machine 0 reaches it."""
    res = _res("gb10", ("spark1", "spark2", "spark3"), **{"hosts.0.roles": ["trainer"], "hosts.1.roles": ["trainer"],
                                                         "hosts.2.roles": ["server"]})
    files = render.render_files(res, publish_ips={"spark1": "10.0.0.1", "spark2": "10.0.0.2", "spark3": "10.0.0.3"})
    assert yaml.safe_load(files["config/trainer.yaml"])["async_grpo"]["vllm_server_base_url"] == \
        "http://10.0.0.3:8000"
    assert _env(files, "spark3")["GRPO_SERVER_PUBLISH"] == "10.0.0.3" and "GRPO_MACHINE_RANK" not in \
        _env(files, "spark3")
    words = [res.engine_info.gpu_words(res, h) for h in res.spec.hosts]
    assert words[0].endswith("(trainer machine 0 of 2: 1 process here, FSDP2 over 2)")
    assert words[1].endswith("(trainer machine 1 of 2: 1 process here, FSDP2 over 2)")


def test_a_named_interface_and_infiniband_reach_the_trainer_hosts_compose_files():
    res = _res("h200", ("t1", "t2", "s"), **{"hosts.0.roles": ["trainer"], "hosts.1.roles": ["trainer"],
                                             "hosts.2.roles": ["server"], "hosts.1.interface": "ib0",
                                             "hosts.1.infiniband": True})
    env = _env(render.render_files(res), "t2")
    assert env["GRPO_SOCKET_IFNAME"] == "ib0"
    assert env["COMPOSE_FILE"].endswith("compose.trainer-hosts.yaml:compose.trainer-infiniband.yaml")
    assert env["GRPO_MAIN_ADDRESS"] == "t1"  # render alone: machine 0 by its spec address


def test_processes_are_per_trainer_host_and_checked_on_each():
    two = _res("cpu", ("a", "b"), **{"hosts.0.roles": ["trainer", "server"], "hosts.1.roles": ["trainer"],
                                     "overrides.runtime": {"trainer_processes": 2}})
    assert yaml.safe_load(render.render_files(two)["config/trainer.yaml"])["processes"] == 2
    assert two.engine_info.trainer_processes(two) == 4  # the group: 2 on each of 2 hosts
    with pytest.raises(spec.SpecError, match=r"trainer_processes: .* is 2 but the trainer on t2 has 1 GPU"):
        _res("h200", ("t1", "t2", "s"), **{"hosts.0.roles": ["trainer"], "hosts.1.roles": ["trainer"],
                                           "hosts.2.roles": ["server"], "hosts.1.gpus": {"trainer": [0]},
                                           "overrides.runtime": {"trainer_processes": 2}})


def test_several_servers_with_several_trainer_hosts_are_refused_in_one_line():
    with pytest.raises(spec.SpecError, match=r"hosts\[2\]\.replicas: .*2 vLLM servers with 2 trainer hosts: the "
                                             r"replica proxy beside a trainer on its host's network is not built"):
        _res("cpu", ("a", "b", "s"), **{"hosts.0.roles": ["trainer"], "hosts.1.roles": ["trainer"],
                                       "hosts.2.roles": ["server"], "hosts.2.replicas": 2})


def test_a_trainer_killed_on_any_trainer_host_restarts_them_all_and_says_which():
    from grpo_deploy.deploy.bringup.trl_async import Servers, _judge
    from grpo_deploy.deploy.supervise import RoleDied

    def servers(**machines):
        return Servers([{"state": "running", "exit_code": 0}], [False], None, False, machines)

    running, killed = {"state": "running", "exit_code": 0}, {"state": "exited", "exit_code": 137}
    with pytest.raises(RoleDied) as died:
        _judge(running, servers(spark2=killed, spark3=running), 6)
    assert (died.value.role, died.value.exit_code, died.value.where) == ("trainer", 137, "on spark2 (machine 1 of 3)")
    with pytest.raises(RoleDied) as gone:  # its container removed
        _judge(running, servers(spark2=running, spark3=None), 6)
    assert gone.value.where == "on spark3 (machine 2 of 3)"
    assert _judge(running, servers(spark2=running), 6) is None
    # a peer's error (exit 1) is not a restart: machine 0 ends with its own error in a moment
    assert _judge(running, servers(spark2={"state": "exited", "exit_code": 1}), 6) is None
    done = {"state": "exited", "exit_code": 0}
    assert _judge(done, servers(spark2=killed), 16) == 0  # finished: nothing to restart
