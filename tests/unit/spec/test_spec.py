"""Tests of grpo_deploy.spec, the package's face: what callers read a spec with (loads, resolve) takes every pair
`init` writes, a bad spec through the CLI writes nothing, and the face re-exports its modules' names."""

from __future__ import annotations

import json
import sys

import pytest

from grpo_deploy import spec
from grpo_deploy.cli import main
from grpo_deploy.spec import new_spec, resolve
from tests.unit.spec.bad_specs import PAIR


def test_init_specs_validate_for_every_supported_pair():
    for profile, engine, hosts in [("cpu", "trl-async", []), ("gb10", "trl-async", ["a", "b"]),
                                   ("h200", "trl-async", ["h"]), ("a100", "verl", ["n1", "n2"])]:
        resolve.resolve(spec.loads(new_spec.spec_text(profile, engine, hosts)))


@pytest.mark.parametrize("mutation", [
    ("  seed: 0", "  seed: 0\n  sead: 1"),
    ("overrides: {}", "overrides: {vllm: {max_loras: 2}}"),
    ("    shared_dir: null", "    mount: /mnt/x"),
    ("profile: gb10", "profile: a100"),
    ("  uid: 1000", "  uid: x"),
])
def test_cli_render_of_bad_spec_exits_nonzero_and_writes_nothing(tmp_path, capsys, mutation):
    bad = tmp_path / "bad.yaml"
    bad.write_text(PAIR.replace(*mutation, 1))
    out = tmp_path / "out"
    assert main(["render", "-f", str(bad), "-o", str(out)]) == 2
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [bad]
    err = capsys.readouterr().err
    assert "bad.yaml:" in err and "nothing was written" in err


def test_cli_preflight_bad_spec_exit_2_json(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(PAIR.replace("  seed: 0", "  seed: 0\n  sead: 1"))
    assert main(["preflight", "-f", str(bad), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == 2 and "run.sead" in out["problems"][0]


def test_the_face_re_exports_the_names_of_its_modules():
    modules = [sys.modules[f"grpo_deploy.spec.{m}"] for m in ("load", "rules", "schema")]
    for name in spec.__all__:
        assert any(getattr(m, name, None) is getattr(spec, name) for m in modules), name
