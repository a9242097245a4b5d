"""grpo_deploy.deploy: one path for a run on any hosts; the CLI does not branch on where hosts are."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from grpo_deploy import deploy as deployer
from grpo_deploy.hosts.connect import SshOptions
from grpo_deploy.spec import loads, new_spec
from grpo_deploy.spec.resolve import resolve

CLI = Path(deployer.__file__).parents[1] / "cli.py"


def _res(hosts: str | None = None):
    text = new_spec.spec_text("cpu", "trl-async", hosts.split(",") if hosts else [], "r1")
    return resolve(loads(text))


def test_the_cli_names_no_host_address_and_neither_deployer():
    """Where hosts are is the deployer's question: the CLI has no `address` test and imports neither the
    bring-up nor the old launcher."""
    tree = ast.parse(CLI.read_text(encoding="utf-8"))
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "address" not in attributes
    assert not {"launch", "lifecycle"} & imported


def test_logs_of_a_role_the_engine_lacks_is_refused_before_any_host_is_reached():
    with pytest.raises(deployer.LaunchError, match="has the roles server, trainer"):
        deployer.logs(_res("spark1,spark2"), SshOptions(None, False), ["head"])


def test_logs_of_another_host_on_a_local_run_is_refused():
    with pytest.raises(deployer.LaunchError, match="--host 'spark1': the spec's hosts are local"):
        deployer.logs(_res(), SshOptions(None, False), [], host="spark1")




def test_logs_of_a_run_never_started_from_here_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(deployer.LaunchError, match="no run r1 was started on local from here .*grpo-deploy up"):
        deployer.logs(_res(), SshOptions(), [])
