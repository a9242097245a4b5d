"""Tests of grpo_deploy.preflight (the package: every check registered, run through run_checks): a check that raises
is reported, not raised; the JSON shape; exit codes. Each check's verdicts are tested with its module (test_spec.py,
test_host.py, test_storage.py, test_session.py)."""

from __future__ import annotations

import json

from grpo_deploy import preflight, spec
from grpo_deploy.cli import main
from grpo_deploy.preflight import registry
from grpo_deploy.spec import new_spec, resolve


def ctx_for(text: str, **kw) -> preflight.Context:
    return preflight.Context(resolve.resolve(spec.loads(text)), **kw)


CPU = new_spec.spec_text("cpu", "trl-async")


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
