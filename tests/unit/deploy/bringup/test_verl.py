"""Tests of grpo_deploy.deploy.bringup.verl: the hosts its containers start on (the head's, then each worker's), its
words for the Ray nodes' addresses, and its verdict on the head and workers' containers (a lost worker is a role
death a restart recovers from)."""

from __future__ import annotations

import pytest

from grpo_deploy.deploy.bringup import verl as bringup
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.deploy.supervise import RoleDied
from grpo_deploy.hosts.connect import SshOptions
from grpo_deploy.spec import loads, new_spec
from grpo_deploy.spec.resolve import resolve

RUNNING = {"state": "running", "exit_code": 0}


def test_a_one_host_run_starts_on_the_head_s_host_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dep = Deployment(resolve(loads(new_spec.spec_text("cpu", "verl", [], "r1"))), SshOptions())
    assert bringup.hosts(dep) == [dep.res.spec.hosts[0].name]
    dep.close()


def test_the_addresses_in_words():
    assert bringup.addresses_words({}) == "one Ray node (this host)"
    assert bringup.addresses_words({"n1": "10.0.0.1", "n2": "10.0.0.2"}) == "Ray nodes at n1 10.0.0.1, n2 10.0.0.2"


def test_the_head_s_exit_ends_the_run_and_a_lost_worker_is_a_role_death():
    assert bringup._judge(RUNNING, {"n2": RUNNING}, 3) is None
    assert bringup._judge({"state": "exited", "exit_code": 0}, {}, 9) == 0
    with pytest.raises(RoleDied) as info:
        bringup._judge(RUNNING, {"n2": {"state": "exited", "exit_code": 137}}, 4)
    assert (info.value.role, info.value.exit_code, info.value.step) == ("worker", 137, 4)
    with pytest.raises(RoleDied):
        bringup._judge(RUNNING, {"n2": None}, 4)  # the worker's container is gone
