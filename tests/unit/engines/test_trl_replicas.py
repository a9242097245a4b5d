"""Tests of the trl-async engine's vLLM server replicas (grpo_deploy.engines.trl_replicas: hosts[].replicas, the replica
proxy's render, the in-flight cap scaled with the replica count, each replica's GPUs) and of the bring-up's verdict
on dead replicas (grpo_deploy.deploy.bringup.trl_async._judge)."""

import pytest
import yaml

from grpo_deploy import render, spec
from grpo_deploy.deploy.bringup.trl_async import PROXY, REPLICA, Servers, _judge
from grpo_deploy.deploy.supervise import RoleDied
from grpo_deploy.engines.trl_replicas import (
    front_args,
    front_services,
    fronted,
    proxy_args,
    replica_count,
    replica_urls,
    server_replicas,
    server_url,
)
from grpo_deploy.runtime.serving.proxy_args import parse_args
from grpo_deploy.runtime.trainer.config import parse_config
from grpo_deploy.spec import resolve
from tests.specs import spec_yaml


def _res(profile="cpu", hosts=("a",), **changes):
    return resolve.resolve(spec.loads(spec_yaml(profile, "trl-async", hosts, **changes), source="s.yaml"))


def test_one_server_keeps_today_s_path_no_proxy():
    res = _res()
    assert replica_count(res) == 1
    assert server_url(res) == "http://server:8000"
    files = render.render_files(res)
    assert "config/proxy.args" not in files and not any(k.endswith(".replicas.yaml") for k in files)
    assert "COMPOSE_PROFILES" not in files["hosts/a.env"]


def test_two_replicas_on_one_host_put_the_proxy_between_them_and_the_trainer():
    res = _res(**{"hosts.0.replicas": 2})
    assert [(r.service, r.place) for r in server_replicas(res)] == [("server", 0), ("server-2", 1)]
    assert server_url(res) == "http://proxy:8000"
    assert replica_urls(res) == ["http://server:8000", "http://server-2:8000"]
    files = render.render_files(res)
    args = [line for line in files["config/proxy.args"].splitlines() if line and not line.startswith("#")]
    lora_dir = parse_config(yaml.safe_load(files["config/trainer.yaml"])).lora_dir  # where the trainer publishes
    assert args == proxy_args(res) == ["--listen", "0.0.0.0:8000", "--adapter-dir", lora_dir,
                                       "--replica", "http://server:8000", "--replica", "http://server-2:8000"]
    assert lora_dir == f"{res.checkpoint_dir}/.vllm_lora"
    assert parse_args(args).adapter_dir == lora_dir  # the proxy takes what the render gives it
    env = files["hosts/a.env"]
    assert "GRPO_SERVICES=server,server-2,proxy,trainer" in env and "COMPOSE_PROFILES=replicas" in env
    assert env.split("COMPOSE_FILE=")[1].split("\n")[0].endswith("/hosts/a.replicas.yaml")
    extra = yaml.safe_load(files["hosts/a.replicas.yaml"].replace("!override", ""))["services"]
    assert list(extra) == ["server-2"]
    assert extra["server-2"]["extends"] == {"file": "compose.yaml", "service": "server"}
    assert extra["server-2"]["ports"] == ["${GRPO_SERVER_PUBLISH:-127.0.0.1}:8001:8000"]
    assert "ports: !override" in files["hosts/a.replicas.yaml"]
    trainer = yaml.safe_load(files["config/trainer.yaml"])["async_grpo"]
    assert trainer["vllm_server_base_url"] == "http://proxy:8000"


def test_the_in_flight_cap_and_queue_scale_with_replicas_unless_the_spec_sets_them():
    one, three = _res(), _res(**{"hosts.0.replicas": 3})
    assert three.settings.trl.max_inflight_tasks == 3 * one.settings.trl.max_inflight_tasks
    assert three.settings.trl.queue_maxsize == 3 * one.settings.trl.queue_maxsize
    assert "x 3 replicas" in three.origins["trl"]["max_inflight_tasks"].why
    kept = _res(**{"hosts.0.replicas": 3, "overrides.trl": {"max_inflight_tasks": 5}})
    assert kept.settings.trl.max_inflight_tasks == 5
    assert kept.settings.trl.queue_maxsize == 3 * one.settings.trl.queue_maxsize


def test_replicas_across_hosts_are_reached_by_address_and_published_port():
    res = _res("h200", ("t", "s1", "s2"), **{"hosts.0.address": "10.0.0.1", "hosts.1.address": "10.0.0.2",
                                            "hosts.2.address": "deploy@10.0.0.3", "hosts.2.replicas": 2,
                                            "hosts.0.roles": ["trainer"], "hosts.1.roles": ["server"],
                                            "hosts.2.roles": ["server"], "hosts.2.gpus": None})
    assert replica_urls(res) == ["http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://10.0.0.3:8001"]
    assert replica_urls(res, {"s2": "192.168.1.3"})[1:] == ["http://192.168.1.3:8000", "http://192.168.1.3:8001"]
    files = render.render_files(res)
    assert "GRPO_SERVER_PUBLISH=10.0.0.3" in files["hosts/s2.env"]  # each server host publishes on its own address
    assert "GRPO_SERVER_PUBLISH=10.0.0.2" in files["hosts/s1.env"]
    assert "GRPO_SERVICES=proxy,trainer" in files["hosts/t.env"]


def test_server_hosts_apart_from_the_trainer_s_get_the_front_and_publish_nothing_themselves():
    """Split and replica deployments: what other hosts reach on a server host is the kit's front (the replica proxy
    asking for the run's token, one per vLLM server, each on the port its server had); vLLM publishes no port there.
    The trainer's host keeps the direct path (its own compose network) and its proxy sends the token on."""
    res = _res("h200", ("t", "s1", "s2"), **{"hosts.0.address": "10.0.0.1", "hosts.1.address": "10.0.0.2",
                                            "hosts.2.address": "deploy@10.0.0.3", "hosts.2.replicas": 2,
                                            "hosts.0.roles": ["trainer", "server"], "hosts.1.roles": ["server"],
                                            "hosts.2.roles": ["server"], "hosts.0.gpus": None,
                                            "hosts.2.gpus": None})
    assert [fronted(res, h) for h in res.spec.hosts] == [False, True, True]
    assert replica_urls(res)[1:] == ["http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://10.0.0.3:8001"]
    files = render.render_files(res)
    env = {name: files[f"hosts/{name}.env"] for name in ("t", "s1", "s2")}
    assert "GRPO_SERVICES=server,proxy,trainer" in env["t"] and "compose.front.yaml" not in env["t"]
    assert "GRPO_SERVICES=server,front" in env["s1"] and "GRPO_SERVICES=server,server-2,front,front-2" in env["s2"]
    assert all("compose.front.yaml" in env[n] and "GRPO_RUN_TOKEN_FILE=" in env[n] for n in ("s1", "s2"))
    front = [line for line in files["config/front.args"].splitlines() if line and not line.startswith("#")]
    assert front == front_args(res) == ["--listen", "0.0.0.0:8000", "--adapter-dir", f"{res.checkpoint_dir}/.vllm_lora",
                                        "--require-token"]
    assert "--require-token" in files["config/proxy.args"].splitlines()  # the trainer's proxy reaches the fronts
    text = files["hosts/s2.replicas.yaml"]
    extra = yaml.safe_load(text.replace("!override", "").replace("!reset", ""))["services"]
    assert extra["server-2"]["ports"] == [] and "ports: !reset []" in text
    assert extra["front-2"]["extends"] == {"file": "compose.front.yaml", "service": "front"}
    assert extra["front-2"]["ports"] == ["${GRPO_SERVER_PUBLISH:-127.0.0.1}:8001:8000"]
    assert extra["front-2"]["command"][-2:] == ["--replica", "http://server-2:8000"]
    assert front_services(res, "s2", ["server-2"]) == ["front-2"] and front_services(res, "t", ["server"]) == []


def test_the_front_compose_file_publishes_only_the_front():
    """compose.front.yaml over compose.yaml: the server has no published port, the front has the server's, asks for
    its token file and is labelled as the front."""
    from grpo_deploy.hosts.project import compose_files

    kit = compose_files()
    base, front = (yaml.safe_load(kit[n].replace("!reset", "")) for n in ("compose.yaml", "compose.front.yaml"))
    assert base["services"]["server"]["ports"] and front["services"]["server"]["ports"] == []
    assert "ports: !reset []" in compose_files()["compose.front.yaml"]
    svc = front["services"]["front"]
    assert svc["ports"] == ["${GRPO_SERVER_PUBLISH:-127.0.0.1}:${GRPO_SERVER_PORT:-8000}:${GRPO_SERVER_PORT:-8000}"]
    assert svc["command"][:5] == ["python3", "-m", "grpo_deploy.runtime.serving.proxy", "@/etc/grpo-deploy/front.args",
                                  "--replica"]
    assert {"path": "${GRPO_RUN_TOKEN_FILE:-/dev/null}", "required": False} in svc["env_file"]
    assert svc["labels"]["org.grpo-deploy.role"] == "front"
    for name in ("proxy", "trainer"):
        assert {"path": "${GRPO_RUN_TOKEN_FILE:-/dev/null}", "required": False} in base["services"][name]["env_file"]
    assert "env_file" not in base["services"]["server"] or all(
        "TOKEN" not in str(e) for e in base["services"]["server"]["env_file"] if isinstance(e, dict))


def test_each_replica_reserves_its_own_gpus():
    res = _res("h200", ("h",), **{"hosts.0.replicas": 2, "hosts.0.gpus": {"server": [0, 1], "trainer": [2, 3]}})
    assert [r.gpus for r in server_replicas(res)] == [(0,), (1,)]
    gpu = yaml.safe_load(render.render_files(res)["hosts/h.gpu.yaml"])["services"]
    ids = {name: svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for name, svc in gpu.items()}
    assert ids == {"server": ["0"], "server-2": ["1"], "trainer": ["2", "3"]}


def test_more_replicas_than_server_gpus_is_refused_with_the_key_to_change():
    with pytest.raises(spec.SpecError, match=r"hosts\[0\]\.replicas: 3 replicas on host h need their own GPUs"):
        _res("h200", ("h",), **{"hosts.0.replicas": 3, "hosts.0.gpus": {"server": [0, 1], "trainer": [2, 3]}})


@pytest.mark.parametrize("value, words", [
    (0, "greater than or equal to 1"), (17, "less than or equal to 16"), (-1, "greater than or equal to 1"),
    ("2\n", "valid integer"), ("$X", "valid integer"), (10**30, "less than or equal to 16"), (True, "valid integer"),
])
def test_hostile_replica_counts_are_refused_at_the_door(value, words):
    with pytest.raises(spec.SpecError, match=rf"hosts\[0\]\.replicas: .*{words}"):
        spec.loads(spec_yaml("cpu", "trl-async", ("a",), **{"hosts.0.replicas": value}), source="s.yaml")


def test_replica_ports_past_65535_are_refused():
    with pytest.raises(spec.SpecError, match=r"hosts\[0\]\.replicas: 3 replicas on host a publish ports "
                                             r"65534-65536 .*lower overrides\.vllm\.port to 65533 or below"):
        _res(**{"hosts.0.replicas": 3, "overrides.vllm": {"port": 65534}})
    assert _res(**{"hosts.0.replicas": 3, "overrides.vllm": {"port": 65533}}).settings.vllm.port == 65533


def test_replicas_on_a_host_without_the_server_role_or_under_verl_are_refused():
    with pytest.raises(spec.SpecError, match=r"hosts\[0\]\.replicas: .*host t runs no server role"):
        spec.loads(spec_yaml("gb10", "trl-async", ("t", "s"), **{"hosts.0.replicas": 2}), source="s.yaml")
    with pytest.raises(spec.SpecError, match=r"hosts\[0\]\.replicas: .*engine verl has none"):
        spec.loads(spec_yaml("cpu", "verl", (), **{"hosts.0.replicas": 2}), source="s.yaml")


def _c(state="running", code=0):
    return {"state": state, "exit_code": code}


def _servers(*replicas, returning=None, proxy=None, many=True):
    return Servers(list(replicas), returning or [False] * len(replicas), proxy, many)


def test_a_dead_replica_among_live_ones_is_restarted_alone_and_all_dead_restarts_the_trainer_too():
    with pytest.raises(RoleDied) as one:
        _judge(_c(), _servers(_c(), _c("exited", 137), proxy=_c()), 7)
    assert (one.value.role, one.value.exit_code, one.value.step) == (REPLICA, 137, 7)
    with pytest.raises(RoleDied) as every:
        _judge(_c(), _servers(_c("exited", 137), None, proxy=_c()), 7)
    assert every.value.role == "server"
    finished = _c("exited", 0)
    assert _judge(finished, _servers(_c(), _c("exited", 137), proxy=_c()), 40) == 0  # nothing to restart
    assert _judge(_c(), _servers(_c(), _c(), proxy=_c()), 3) is None


def test_a_replica_still_coming_back_does_not_count_as_serving():
    with pytest.raises(RoleDied) as died:  # server-2 is restarting, then server dies: no replica serves
        _judge(_c(), _servers(_c("exited", 137), _c(), returning=[False, True], proxy=_c()), 9)
    assert died.value.role == "server"


def test_a_dead_proxy_is_restarted_and_one_server_needs_none():
    with pytest.raises(RoleDied) as died:
        _judge(_c(), _servers(_c(), _c(), proxy=_c("exited", 137)), 4)
    assert (died.value.role, died.value.exit_code) == (PROXY, 137)
    with pytest.raises(RoleDied):
        _judge(_c(), _servers(_c(), _c(), proxy=None), 4)
    assert _judge(_c(), _servers(_c(), many=False), 4) is None


def test_several_replicas_need_a_compose_that_knows_override():
    from grpo_deploy.preflight.host import replicas_compose_problem

    res = _res(**{"hosts.0.replicas": 2})
    host = res.spec.hosts[0]
    assert replicas_compose_problem(host, "2.24.4") is None and replicas_compose_problem(host, "v5.6.1") is None
    old = replicas_compose_problem(host, "2.20.2")
    assert old.verdict == "fail" and "older than 2.24.4" in old.fact and "upgrade" in old.hint
    assert replicas_compose_problem(_res().spec.hosts[0], "2.20.2") is None  # one server: no override rendered
