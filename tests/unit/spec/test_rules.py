"""Tests of grpo_deploy.spec.rules: the cross-field checks of a loaded spec (hosts, profiles against the engine, role
counts, the shared volume, checkpoints, images and overrides the engine does not read), each at its key and line."""

from __future__ import annotations

import pytest
import yaml

from grpo_deploy import spec
from grpo_deploy.cli import main
from grpo_deploy.spec import new_spec, resolve
from tests.specs import spec_data, spec_yaml
from tests.unit.spec.bad_specs import PAIR
from tests.unit.spec.bad_specs import line_of as _line_of
from tests.unit.spec.bad_specs import problems as _problems


def test_mount_point_differing_between_hosts():
    (p,) = _problems(spec_yaml(**{"hosts.1.mount": "/mnt/nfs"}))
    assert p.key == "hosts[1].mount" and "/mnt/nfs" in p.message and "/shared" in p.message


def test_profile_not_matching_engine():
    text = PAIR.replace("profile: gb10", "profile: a100", 1)
    problems = _problems(text)
    assert any(p.key == "hosts[0].profile" and "does not support engine 'trl-async'" in p.message for p in problems)


def test_unknown_profile():
    problems = _problems(PAIR.replace("profile: gb10", "profile: b200", 1))
    assert any("unknown profile 'b200'" in p.message for p in problems)


def test_checkpoint_dir_off_the_shared_volume_rejected():
    (p,) = _problems(PAIR.replace("  dir: null", "  dir: /data/ckpt"))
    assert p.key == "checkpoints.dir" and "shared volume" in p.message


def test_two_trainer_hosts_are_one_trainer_and_seventeen_are_refused():
    res = resolve.resolve(spec.loads(PAIR.replace("roles: [server]", "roles: [server, trainer]"), source="s.yaml"))
    assert [h.name for h in res.engine_info.cluster_nodes(res)] == ["spark1", "spark2"]
    many = spec_data("cpu", "trl-async", [f"h{i}" for i in range(17)])
    many["hosts"].append({**many["hosts"][-1], "name": "h17", "address": "h17"})
    for host in many["hosts"]:
        host["roles"] = ["trainer"]
    many["hosts"][0]["roles"] = ["trainer", "server"]
    problems = _problems(yaml.safe_dump(many, sort_keys=False))
    assert any("trainer" in p.message and "16" in p.message for p in problems), [p.message for p in problems]


@pytest.mark.parametrize(("engine_spec", "key", "runs"), [
    (new_spec.spec_text("a100", "verl", []), "server", "verl"),
    (new_spec.spec_text("a100", "verl", []), "trainer", "verl"),
    (PAIR, "verl", "server, trainer"),
])
def test_an_image_key_the_engine_does_not_run_is_refused_at_the_door(engine_spec, key, runs):
    text = engine_spec.replace(f"  {key}: null", f"  {key}: example/{key}:1", 1)
    (p,) = _problems(text)
    assert p.key == f"images.{key}" and p.where == f"bad.yaml:{_line_of(text, f'example/{key}:1')}"
    assert p.message.endswith(f"runs no {key!r} image (its roles run: {runs}): remove images.{key}")


def test_cli_refuses_an_image_the_engine_does_not_run_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(new_spec.spec_text("a100", "verl", []).replace("  server: null", "  server: example/s:1", 1))
    assert main(["render", "-f", str(bad), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "images.server" in err and "engine verl runs no 'server' image" in err and "Traceback" not in err


def test_an_overrides_section_the_engine_never_reads_is_refused_at_the_door():
    text = new_spec.spec_text("a100", "verl", []).replace("overrides: {}", "overrides: {trl: {max_steps: 3}}", 1)
    (p,) = _problems(text)
    assert p.key == "overrides.trl" and p.where == f"bad.yaml:{_line_of(text, 'max_steps: 3')}"
    assert p.message == ("engine verl never reads the trl settings (it reads: model, lora, data, checkpoints, "
                         "verl): remove overrides.trl")
    (p,) = _problems(PAIR.replace("overrides: {}", "overrides: {verl: {trainer.total_epochs: 2}}", 1))
    assert p.key == "overrides.verl" and "engine trl-async never reads the verl settings" in p.message
