"""Tests of grpo_deploy.spec.new_spec: init specs per profile/engine and host list; the embedded default."""

import pytest

from grpo_deploy import spec
from grpo_deploy.spec import new_spec


def test_pair_puts_trainer_first_and_server_second_with_nfs():
    s = spec.loads(new_spec.spec_text("gb10", "trl-async", ["spark1", "spark2"])).spec
    assert [(h.name, h.roles) for h in s.hosts] == [("spark1", ["trainer"]), ("spark2", ["server"])]
    assert s.storage.nfs.server == "spark1"


def test_verl_hosts_head_then_workers():
    s = spec.loads(new_spec.spec_text("a100", "verl", ["n1", "n2", "n3"])).spec
    assert [h.roles for h in s.hosts] == [["head"], ["worker"], ["worker"]]


def test_three_trl_hosts_are_a_trainer_and_two_server_replicas_behind_the_proxy():
    s = spec.loads(new_spec.spec_text("gb10", "trl-async", ["t", "s1", "s2"])).spec
    assert [h.roles for h in s.hosts] == [["trainer"], ["server"], ["server"]]


def test_embedded_default_is_the_local_cpu_rehearsal():
    s = new_spec.embedded_default().spec
    assert s.engine == "trl-async" and s.run.name == "rehearsal"
    assert [(h.address, h.profile, h.roles) for h in s.hosts] == [("local", "cpu", ["server", "trainer"])]


@pytest.mark.parametrize("profile,engine,hosts,match", [
    ("a100", "trl-async", [], "does not support engine"),
    ("cpu", "sglang", [], "unknown engine"),
    ("gb10", "trl-async", [f"h{i}" for i in range(18)], "at most 17 hosts .*hosts\\[\\]\\.replicas"),
    ("nope", "verl", [], "unknown profile"),
])
def test_init_errors(profile, engine, hosts, match):
    with pytest.raises(new_spec.InitError, match=match):
        new_spec.spec_text(profile, engine, hosts)


def test_every_key_is_commented():
    lines = new_spec.spec_text("cpu", "trl-async").splitlines()
    keys = [(i, ln) for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith(("#", "-"))
            and ":" in ln and not ln.rstrip().endswith(":")]
    # a key's comment is on its line, or (a long one) on the line above it
    uncommented = [ln for i, ln in keys if "#" not in ln and not (i and lines[i - 1].lstrip().startswith("#"))
                   and not ln.startswith(("version", "engine")) and "profile:" not in ln and "name:" not in ln
                   and "address" not in ln]
    assert len(uncommented) < len(keys) / 3, uncommented


def test_host_names_come_from_the_address_host_part():
    assert new_spec.host_name("user@Node-1.example:2222") == "node-1-example"
    assert new_spec.host_name("fe80::1") == new_spec.host_name("[fe80::1]:22") == "fe80--1"
    with pytest.raises(new_spec.InitError, match="would be read as an option"):
        new_spec.spec_text("gb10", "trl-async", ["-oProxyCommand=x", "b"])
