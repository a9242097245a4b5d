"""Tests of grpo_deploy.preflight: check verdicts from facts, JSON shape, exit codes."""

from __future__ import annotations

import json

from grpo_deploy import preflight, spec
from grpo_deploy.cli import main
from grpo_deploy.preflight import registry
from grpo_deploy.spec import new_spec, resolve


def ctx_for(text: str, **kw) -> preflight.Context:
    return preflight.Context(resolve.resolve(spec.loads(text)), **kw)


CPU = new_spec.spec_text("cpu", "trl-async")


def _only(ctx, name):
    return [r for r in preflight.run_checks(ctx, only=[name])]


def test_identity_split_uid_fails_naming_uid_umask_and_path():
    text = CPU.replace("  roles: {}", "  roles: {trainer: {uid: 2000, gid: 2000, umask: '0077'}}")
    (r,) = _only(ctx_for(text), "identity")
    assert r.verdict == "fail"
    assert "UID 2000:2000" in r.fact and "umask 0077" in r.fact and "/shared/runs/rehearsal" in r.fact


def test_identity_same_uid_passes():
    (r,) = _only(ctx_for(CPU), "identity")
    assert r.verdict == "ok"


def test_wandb_without_key_fails_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    text = CPU.replace("kind: none", "kind: wandb")
    (r,) = _only(ctx_for(text, environ={}), "logger")
    assert r.verdict == "fail" and "WANDB_API_KEY" in r.fact


def test_wandb_with_netrc_passes(tmp_path, monkeypatch):
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path))
    (r,) = _only(ctx_for(CPU.replace("kind: none", "kind: wandb"), environ={}), "logger")
    assert r.verdict == "ok"


def test_wandb_offline_passes():
    (r,) = _only(ctx_for(CPU.replace("kind: none", "kind: wandb"), environ={"WANDB_MODE": "offline"}), "logger")
    assert r.verdict == "ok"


def test_disk_fails_with_what_if_free_space():
    (r,) = _only(ctx_for(CPU, free_space={"local": 10**6}), "disk")
    assert r.verdict == "fail" and "runs out of disk" in r.fact and r.hint


def test_arch_mismatch_fails_for_gpu_profile_here():
    """This machine has no NVIDIA GPU: an h200 profile on the local host must fail the arch check."""
    import os

    (r,) = _only(ctx_for(new_spec.spec_text("h200", "trl-async")), "arch")
    if os.uname().machine == "x86_64":
        assert r.verdict == "fail" and "GPU" in r.fact
    else:
        assert r.verdict == "fail" and "x86_64" in r.fact


def test_a_check_that_raises_is_reported_not_raised(monkeypatch):
    def boom(ctx):
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(registry, "CHECKS", [registry.Check("boom", "explodes", boom)])
    (r,) = preflight.run_checks(ctx_for(CPU))
    assert r.verdict == "fail" and "probe exploded" in r.fact


def test_json_shape_and_exit_code(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(["preflight", "--json", "--only", "identity", "--only", "logger"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True and out["exit_code"] == 0
    assert {c["check"] for c in out["checks"]} == {"identity", "logger"}
    assert set(out["checks"][0]) == {"check", "host", "verdict", "fact", "hint", "data"}


def test_exit_1_when_a_check_fails(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(CPU.replace("  roles: {}", "  roles: {trainer: {uid: 2000}}"))
    assert main(["preflight", "-f", str(f), "--only", "identity"]) == 1
    assert "FAIL" in capsys.readouterr().out


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


def test_port_check_refuses_a_run_with_running_containers():
    """The verdict from the server host's gathered facts (the gathering runs in every real preflight: integration)."""
    ctx = ctx_for(CPU)
    ctx._facts = {"local": {"running": ["grpo-rehearsal-server-1"], "listening": {8000: True}}}
    (r,) = _only(ctx, "port")
    assert r.verdict == "fail" and "grpo-rehearsal-server-1" in r.fact and "grpo-deploy down" in r.hint
    ctx._facts = {"local": {"running": [], "listening": {8000: True}}}
    (r,) = _only(ctx, "port")
    assert r.verdict == "fail" and "already listens on port 8000" in r.fact
    ctx._facts = {"local": {"running": [], "listening": {8000: None}}}
    assert _only(ctx, "port")[0].verdict == "warn"
    ctx._facts = {"local": {"running": [], "listening": {8000: False}}}
    assert _only(ctx, "port")[0].verdict == "ok"
    ctx._facts = {"local": {"running": [], "listening": {8000: False, 8001: True}}}  # a second replica's port
    (r,) = _only(ctx, "port")
    assert r.verdict == "fail" and "already listens on port 8001 there (the replicas publish ports 8000-8001)" in r.fact


def test_checkpoint_headroom_warns_below_one_checkpoint_plus_margin():
    roomy = {"filesystem": "spark1:/shared", "free_bytes": 10 * 10**9, "checkpoint_bytes": 10**9,
             "margin_bytes": 2 * 10**9, "ok": True}
    assert "WARNING" not in preflight.headroom_text(roomy)
    assert "10.0 GB free; next checkpoint 1.00 GB + 2.0 GB margin (spark1:/shared)" in preflight.headroom_text(roomy)
    short = {**roomy, "free_bytes": int(2.5 * 10**9), "ok": False}
    assert "WARNING: the next checkpoint may not fit" in preflight.headroom_text(short)
    assert "free space unknown" in preflight.headroom_text(None)


def test_checkpoint_headroom_from_the_plan():
    res = resolve.resolve(spec.loads(new_spec.spec_text("cpu", "trl-async")))
    for free, ok in ((10**12, True), (10**6, False)):
        ctx = preflight.Context(res, free_space={"local": free})
        h = preflight.checkpoint_headroom(ctx)
        assert h["free_bytes"] == free and h["ok"] is ok
        assert h["checkpoint_bytes"] == ctx.plan().disk.checkpoint_bytes
