"""Tests of grpo_deploy.spec: schema, file:line errors, cross-field rules, and that bad specs write nothing."""

from __future__ import annotations

import pytest
import yaml

from grpo_deploy import spec
from grpo_deploy.cli import main
from grpo_deploy.spec import new_spec, resolve
from tests.specs import loaded, spec_data, spec_yaml

PAIR = new_spec.spec_text("gb10", "trl-async", ["spark1", "spark2"])


def _problems(text: str) -> list[spec.Problem]:
    with pytest.raises(spec.SpecError) as info:
        resolve.resolve(spec.loads(text, source="bad.yaml"))
    return info.value.problems


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


def test_init_specs_validate_for_every_supported_pair():
    for profile, engine, hosts in [("cpu", "trl-async", []), ("gb10", "trl-async", ["a", "b"]),
                                   ("h200", "trl-async", ["h"]), ("a100", "verl", ["n1", "n2"])]:
        resolve.resolve(spec.loads(new_spec.spec_text(profile, engine, hosts)))


def test_unknown_key_names_file_line_and_key():
    text = PAIR.replace("  seed: 0", "  seed: 0\n  sead: 1")
    (p,) = _problems(text)
    assert p.key == "run.sead" and "unknown key" in p.message
    assert p.where == f"bad.yaml:{_line_of(text, 'sead')}"


def test_wrong_type_names_the_key():
    (p,) = _problems(PAIR.replace("  uid: 1000", "  uid: lots"))
    assert p.key == "run.uid" and "integer" in p.message


def test_max_loras_too_small_for_staleness():
    (p,) = _problems(PAIR.replace("overrides: {}", "overrides: {vllm: {max_loras: 3}, trl: {max_staleness: 4}}"))
    assert p.key == "overrides.vllm.max_loras"
    assert "max_staleness" in p.message and ">= 6" in p.message


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


def test_relative_checkpoint_dir_rejected():
    (p,) = _problems(PAIR.replace("  dir: null", "  dir: checkpoints/run1"))
    assert p.key == "checkpoints.dir" and "absolute" in p.message


def test_checkpoint_dir_off_the_shared_volume_rejected():
    (p,) = _problems(PAIR.replace("  dir: null", "  dir: /data/ckpt"))
    assert p.key == "checkpoints.dir" and "shared volume" in p.message


def test_verl_save_total_limit_rejected_with_the_key_to_use():
    text = new_spec.spec_text("a100", "verl", ["n1"]).replace("overrides: {}",
                                                              "overrides: {verl: {trainer.save_total_limit: 3}}")
    (p,) = _problems(text)
    assert p.key == "overrides.verl.trainer.save_total_limit" and "checkpoints.keep" in p.message


def test_unknown_trl_override_rejected():
    (p,) = _problems(PAIR.replace("overrides: {}", "overrides: {trl: {learnin_rate: 1}}"))
    assert p.key == "overrides.trl.learnin_rate"


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


def test_yaml_syntax_error_names_line():
    with pytest.raises(spec.SpecError) as info:
        spec.loads("engine: trl-async\nhosts: [\n", source="broken.yaml")
    assert "broken.yaml" in str(info.value)


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
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == 2 and "run.sead" in out["problems"][0]


def test_bad_role_umask_names_the_role_key():
    (p,) = _problems(PAIR.replace("  roles: {}", "  roles: {trainer: {umask: '0088'}}"))
    assert p.key == "run.roles.trainer.umask" and "write an octal string such as '0022'" in p.message
    assert p.where == f"bad.yaml:{_line_of(PAIR, '  roles: {}')}"


def test_run_and_role_umasks_are_padded_to_four_digits():
    res = resolve.resolve(loaded(**{"run.umask": "027", "run.roles": {"trainer": {"umask": "077"}}}))
    assert res.identities["server"].umask == "0027" and res.identities["trainer"].umask == "0077"


def test_dataset_names_are_the_runtime_ones():
    from grpo_deploy.runtime.tasks.data import DATASETS

    for name in DATASETS:
        spec.loads(PAIR.replace("  name: null                        # null = the profile's", f"  name: {name} #"))
    (p,) = _problems(PAIR.replace("  name: null                        # null = the profile's", "  name: foo #"))
    assert p.key == "dataset.name" and all(repr(name) in p.message for name in DATASETS)


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
