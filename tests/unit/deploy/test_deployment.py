"""Tests of grpo_deploy.deploy.deployment: a run's hosts as the deployer holds them, on this machine (a local spec:
LocalHost connectors, the run's own folder as its compose project's folder, the preflight session over the same
connectors)."""

from __future__ import annotations

from pathlib import Path

from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.hosts.connect import LocalHost, SshOptions
from grpo_deploy.spec import loads, new_spec
from grpo_deploy.spec.resolve import resolve


def _dep(engine: str = "trl-async") -> Deployment:
    return Deployment(resolve(loads(new_spec.spec_text("cpu", engine, [], "r1"))), SshOptions())


def test_a_local_run_has_one_local_connector_and_its_project_in_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dep = _dep()
    (name,) = dep.hosts
    assert isinstance(dep.hosts[name], LocalHost)
    project = dep.project(name)
    assert project is dep.project(name)  # made once
    assert Path(project.root) == (tmp_path / ".grpo-deploy" / "r1").resolve() == dep.state.dir
    assert dep.role_host("trainer") == dep.role_host("server") == name and dep.role_project("server") is project
    dep.close()


def test_the_preflight_session_reuses_the_deployments_connectors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dep = _dep("verl")
    ctx = dep.context
    assert ctx is dep.context and ctx.res is dep.res
    host = dep.res.spec.hosts[0]
    assert ctx.connector(host) is dep.hosts[host.name]
    dep.close()
