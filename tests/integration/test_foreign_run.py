"""deploy.refuse_foreign_run on a real engine: containers of a run of the same name started from another folder's
render refuse the `up` (naming that folder); the run's own containers, or another run's, do not."""

from __future__ import annotations

import secrets

import pytest
import yaml

from grpo_deploy import names, spec
from grpo_deploy.deploy import lifecycle as deploy
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.hosts.connect import SshOptions
from grpo_deploy.hosts.project import ENV_FILE_LABEL
from grpo_deploy.spec import resolve
from tests.specs import spec_data

BASE_IMAGE = "grpo-deploy/debian:bookworm"


@pytest.fixture()
def dep(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = f"foreign-{secrets.token_hex(4)}"
    res = resolve.resolve(spec.loads(yaml.safe_dump(spec_data("cpu", "trl-async", (), **{"run.name": name}))))
    return Deployment(res, SshOptions())


@pytest.fixture()
def start(docker_client):
    started = []

    def run(run_name: str, env_file: str):
        c = docker_client.containers.run(BASE_IMAGE, ["sleep", "300"], detach=True, labels={
            names.RUN_LABEL: run_name, ENV_FILE_LABEL: env_file, names.ROLE_LABEL: "server"})
        started.append(c)
        return c

    yield run
    for c in started:
        c.remove(force=True)


def test_a_run_started_from_another_folder_refuses_up(dep, start):
    name = dep.res.spec.run.name
    c = start(name, f"/srv/elsewhere/.grpo-deploy/{name}/render/hosts/local.env")
    with pytest.raises(LaunchError) as caught:
        deploy.refuse_foreign_run(dep)
    line = str(caught.value)
    assert "\n" not in line and f"run {name} is already running on this Docker engine, started from /srv/elsewhere" \
        in line and c.name in line and "grpo-deploy down" in line


def test_the_runs_own_containers_and_other_runs_pass(dep, start):
    name = dep.res.spec.run.name
    start(name, dep.project("local").env_file)  # left up by `up --keep` from this folder
    start(f"{name}-other", f"/srv/elsewhere/.grpo-deploy/{name}-other/render/hosts/local.env")
    deploy.refuse_foreign_run(dep)
