"""Tests of grpo_deploy.preflight.session: the session's Docker client, where the checkpoints land and how much is
free there (measured, given with --free-space, the run's own checkpoints counted as free on a resume), the image keys
a host needs."""

from __future__ import annotations

import os

import yaml

from grpo_deploy import preflight, spec
from grpo_deploy.preflight import session
from grpo_deploy.spec import new_spec, resolve
from tests.specs import spec_data

CPU = new_spec.spec_text("cpu", "trl-async")


def ctx_for(text: str, **kw) -> preflight.Context:
    return preflight.Context(resolve.resolve(spec.loads(text)), **kw)


class _FakeContainers:
    def __init__(self, found):
        self.found, self.calls = found, []

    def list(self, **kw):
        self.calls.append(kw)
        return self.found


class _FakeClient:
    def __init__(self, found=()):
        self.containers = _FakeContainers(list(found))


def test_context_uses_the_client_it_is_given(monkeypatch):
    from grpo_deploy.hosts import docker_api

    def no_new_client():
        raise AssertionError("a second Docker client was made")

    monkeypatch.setattr(docker_api, "client", no_new_client)
    client = _FakeClient()
    ctx = ctx_for(CPU, client=client)
    assert ctx.docker() is client and ctx.docker_error is None



def test_a_resume_counts_the_runs_own_checkpoints_as_free(tmp_path, monkeypatch):
    share = tmp_path / "share"
    data = spec_data("cpu", "trl-async", (), **{"hosts.0.shared_dir": str(share)})
    res = resolve.resolve(spec.loads(yaml.safe_dump(data)))
    ckpt = share / os.path.relpath(res.checkpoint_dir, res.spec.storage.mount)
    (ckpt / "checkpoint-20").mkdir(parents=True)
    (ckpt / "checkpoint-20" / "optimizer.pt").write_bytes(b"o" * 10**6)
    (ckpt / "quarantine" / "checkpoint-40").mkdir(parents=True)
    (ckpt / "quarantine" / "checkpoint-40" / "optimizer.pt").write_bytes(b"q" * 3 * 10**6)
    measured = preflight.measured_free_space(preflight.Context(res))
    raw = measured[0]
    # the filesystem's free space, read once: another job writing to the same disk between two reads is not the kit
    monkeypatch.setattr(session, "measured_free_space", lambda ctx: measured)
    free, where, how = preflight.checkpoint_free_space(preflight.Context(res))
    assert 10**6 <= free - raw < 10**6 + 3 * 4096 + 8192  # the checkpoint, not the quarantined one
    assert "this run's own checkpoints" in how
    assert preflight.checkpoint_headroom(preflight.Context(res))["free_bytes"] <= raw + 4096  # status: what is free
    monkeypatch.undo()
    given = preflight.checkpoint_free_space(preflight.Context(res, free_space={"local": 123}))
    assert given[0] == 123  # a what-if figure is taken as given



def test_free_space_given_with_free_space_is_taken_as_given_and_named_so():
    ctx = ctx_for(CPU, free_space={"local": 4242})
    assert session.measured_free_space(ctx) == (4242, f"local:{ctx.res.checkpoint_dir}", "given with --free-space")


def test_free_space_of_a_shared_dir_is_measured_with_df_on_this_machine(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    res = resolve.resolve(spec.loads(yaml.safe_dump(spec_data("cpu", "trl-async", (),
                                                              **{"hosts.0.shared_dir": str(share)}))))
    ctx = preflight.Context(res)
    host = session.storage_host(res)
    assert host.name == res.host_for(res.engine_info.main_role).name
    assert session.storage_path(res, host, ctx.connector(host)).startswith(str(share) + "/")
    free, where, how = session.measured_free_space(ctx)
    assert free is not None and free > 0 and where.startswith(str(tmp_path)) and how.startswith("df on the host")
    ctx.close()


def test_an_nfs_export_is_measured_on_its_server_not_here():
    nfs = CPU.replace("nfs: null", "nfs: {server: 10.0.0.5, export: /export/grpo}")
    free, where, how = session.measured_free_space(ctx_for(nfs))
    assert free is None and where == "nfs 10.0.0.5:/export/grpo" and "measured on its server" in how


def test_image_roles_are_the_images_a_hosts_roles_run_each_once():
    res = resolve.resolve(spec.loads(CPU))
    assert session.image_roles(res, res.spec.hosts[0]) == res.engine_info.images_on(res.spec.hosts[0].roles)
    verl = resolve.resolve(spec.loads(new_spec.spec_text("cpu", "verl")))
    assert session.image_roles(verl, verl.spec.hosts[0]) == ["verl"]
