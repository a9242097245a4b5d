"""Tests of grpo_deploy.spec.load: a spec's YAML to a LoadedSpec, each problem with its file:line and dotted key,
credentials of the environment refused in a spec, and a bad spec through the CLI writes nothing."""

from __future__ import annotations

import pytest

from grpo_deploy import spec
from grpo_deploy.spec.load import load, loads, parse, secret_values
from grpo_deploy.spec.yamlpos import load_text
from tests.unit.spec.bad_specs import PAIR
from tests.unit.spec.bad_specs import line_of as _line_of
from tests.unit.spec.bad_specs import problems as _problems


def test_unknown_key_names_file_line_and_key():
    text = PAIR.replace("  seed: 0", "  seed: 0\n  sead: 1")
    (p,) = _problems(text)
    assert p.key == "run.sead" and "unknown key" in p.message
    assert p.where == f"bad.yaml:{_line_of(text, 'sead')}"


def test_a_value_that_is_none_of_a_unions_kinds_is_one_line_naming_each():
    # watch.cap_share is a number in (0, 1], 'auto' or null: a bad value says both in one line, the newline escaped
    assert "\n  cap_share: auto\n" in PAIR
    text = PAIR.replace("\n  cap_share: auto\n", '\n  cap_share: "auto\\nx"\n')
    (p,) = _problems(text)
    assert p.key == "watch.cap_share" and "\n" not in str(p)
    assert "valid number" in p.message and "; or " in p.message and "is not one of 'auto'" in p.message


def test_yaml_syntax_error_names_line():
    with pytest.raises(spec.SpecError) as info:
        spec.loads("engine: trl-async\nhosts: [\n", source="broken.yaml")
    assert "broken.yaml" in str(info.value)


TOKEN = "hf_abcdefghijklmnop"


def test_secret_values_are_the_credentials_of_the_environment_long_enough_to_match():
    environ = {"HF_TOKEN": TOKEN, "MY_API_KEY": "k3y-value", "GITHUB_TOKEN": "short", "HOME": "/home/someone",
               "DB_PASSWORD": "hunter22"}
    assert secret_values(environ) == {TOKEN: "HF_TOKEN", "k3y-value": "MY_API_KEY", "hunter22": "DB_PASSWORD"}
    assert secret_values({}) == {}


@pytest.mark.parametrize(("old", "new", "key"), [
    ("  served_name: null ", f"  served_name: org/{TOKEN}-x ", "model.served_name"),
    ("overrides: {}", f"overrides: {{vllm: {{env: {{{TOKEN}: '1'}}}}}}", "overrides.vllm.env.<a key>"),
])
def test_a_spec_holding_a_credential_is_refused_at_its_key_without_showing_it(old, new, key):
    text = PAIR.replace(old, new, 1)
    assert text != PAIR
    with pytest.raises(spec.SpecError) as info:
        parse(load_text(text, "bad.yaml"), environ={"HF_TOKEN": TOKEN})
    (p,) = info.value.problems
    assert p.key == key and "$HF_TOKEN" in p.message and TOKEN not in str(info.value)
    parse(load_text(text, "bad.yaml"), environ={})  # the same text without that credential around loads


@pytest.mark.parametrize(("text", "says"), [
    ("- a\n- b\n", "the spec must be a YAML mapping"),
    ("name: x\nimage: y\n", "this is not a deployment spec (none of its 2 top-level key(s)"),
])
def test_a_file_that_is_not_a_spec_is_said_so_without_quoting_it(text, says):
    with pytest.raises(spec.SpecError) as info:
        loads(text, source="other.yaml")
    (p,) = info.value.problems
    assert p.key == "<top>" and says in p.message and "image: y" not in p.message


def test_load_reads_a_spec_file_and_names_the_file_in_a_syntax_error(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(PAIR)
    assert [h.name for h in load(good).spec.hosts] == ["spark1", "spark2"]
    bad.write_text("engine: trl-async\nhosts: [\n")
    with pytest.raises(spec.SpecError) as info:
        load(bad)
    assert info.value.problems[0].where == str(bad) and info.value.problems[0].key == "<file>"
