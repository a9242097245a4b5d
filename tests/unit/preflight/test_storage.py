"""Tests of grpo_deploy.preflight.storage: the identity check (one non-root UID/GID and a readable umask), the disk
check, and the checkpoints' headroom (checkpoint_headroom, headroom_text)."""

from __future__ import annotations

from grpo_deploy import preflight, spec
from grpo_deploy.spec import new_spec, resolve


def ctx_for(text: str, **kw) -> preflight.Context:
    return preflight.Context(resolve.resolve(spec.loads(text)), **kw)


CPU = new_spec.spec_text("cpu", "trl-async")


def _only(ctx, name):
    return list(preflight.run_checks(ctx, only=[name]))



def test_identity_split_uid_fails_naming_uid_umask_and_path():
    text = CPU.replace("  roles: {}", "  roles: {trainer: {uid: 2000, gid: 2000, umask: '0077'}}")
    (r,) = _only(ctx_for(text), "identity")
    assert r.verdict == "fail"
    assert "UID 2000:2000" in r.fact and "umask 0077" in r.fact and "/shared/runs/rehearsal" in r.fact


def test_identity_same_uid_passes():
    (r,) = _only(ctx_for(CPU), "identity")
    assert r.verdict == "ok"


def test_disk_fails_with_what_if_free_space():
    (r,) = _only(ctx_for(CPU, free_space={"local": 10**6}), "disk")
    assert r.verdict == "fail" and "runs out of disk" in r.fact and r.hint


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

