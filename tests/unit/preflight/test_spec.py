"""Tests of grpo_deploy.preflight.spec: the checks that read only the resolved spec and this machine's environment
(spec, memory, logger)."""

from __future__ import annotations

from grpo_deploy import preflight, spec
from grpo_deploy.spec import new_spec, resolve


def ctx_for(text: str, **kw) -> preflight.Context:
    return preflight.Context(resolve.resolve(spec.loads(text)), **kw)


CPU = new_spec.spec_text("cpu", "trl-async")


def _only(ctx, name):
    return list(preflight.run_checks(ctx, only=[name]))



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



def test_spec_check_names_the_engine_hosts_and_shared_volume():
    (r,) = _only(ctx_for(CPU), "spec")
    assert r.verdict == "ok" and r.fact.startswith("trl-async on local(") and "shared volume at /shared" in r.fact


def test_memory_check_skips_a_cpu_host_and_judges_a_gpu_host():
    (r,) = _only(ctx_for(CPU), "memory")
    assert r.verdict in ("ok", "skip") and r.host == "local"
    results = _only(ctx_for(new_spec.spec_text("h200", "trl-async")), "memory")
    assert results and {r.verdict for r in results} <= {"ok", "fail"}
    assert all("GB" in r.fact for r in results)


def test_mlflow_without_a_tracking_uri_warns_and_jsonl_needs_nothing():
    (r,) = _only(ctx_for(CPU.replace("kind: none", "kind: mlflow"), environ={}), "logger")
    assert r.verdict == "warn" and "MLFLOW_TRACKING_URI" in r.hint
    (r,) = _only(ctx_for(CPU.replace("kind: none", "kind: mlflow"), environ={"MLFLOW_TRACKING_URI": "http://m"}),
                 "logger")
    assert r.verdict == "ok"
    (r,) = _only(ctx_for(CPU.replace("kind: none", "kind: jsonl")), "logger")
    assert r.verdict == "ok" and "no credentials needed" in r.fact
