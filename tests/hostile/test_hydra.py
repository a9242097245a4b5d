"""verl's overrides file: every value the kit quotes for Hydra reads back as itself (checked with the small reader in
helpers, which follows Hydra's lexer and OmegaConf's interpolation escapes), and no value makes a second line."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_deploy.common.values import CONTROL
from grpo_deploy.engines.verl import hydra_value
from grpo_deploy.templating import RenderError
from tests.hostile.helpers import assert_refused, changed, hydra_parse, render, rendered_files

# Characters that matter to Hydra, OmegaConf, YAML or a shell, and a little of everything else.
_TRICKY = st.sampled_from(list("'\"\\$,[]{}():=# \t.-+@%*/_~!") + ["${", "${oc.env:WANDB_API_KEY}", "\\'", "true",
                                                                  "null", "nan", "inf", "1e3", "ü", "日本"])
_TEXT = st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=10).map("".join)
_SCALAR = st.one_of(st.booleans(), st.none(), st.integers(), st.floats(allow_nan=True), _TEXT)


def _same(a, b) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(database=None, max_examples=250, deadline=None)
@given(st.one_of(_SCALAR, st.lists(_SCALAR, max_size=4)))
def test_hydra_value_reads_back_as_itself(value):
    items = value if isinstance(value, list) else [value]
    if any(isinstance(v, str) and CONTROL.search(v) for v in items):
        with pytest.raises(RenderError):  # a line break or control character: refused, never written
            hydra_value(value)
        return
    text = hydra_value(value)
    assert len(f"trainer.x={text}".splitlines()) == 1
    key, back = hydra_parse(f"trainer.x={text}")
    assert key == "trainer.x" and _same(value, back), (value, text, back)


@pytest.mark.parametrize(("value", "expected"), [
    ("a\\b", "'a\\b'"),  # a backslash not before a quote is literal in Hydra: never doubled
    ("a\\", "'a\\\\'"),  # before the closing quote: doubled
    ("it's", "'it\\'s'"),
    ("${oc.env:WANDB_API_KEY}", "'\\${oc.env:WANDB_API_KEY}'"),  # OmegaConf would read the environment
    ("5", "'5'"),  # a string that Hydra would read as a number stays a string
    ("nan", "'nan'"),
    ("a,b]", "'a,b]'"),
    (["x'y", "5"], "[\"x'y\",\"5\"]"),
])
def test_hydra_value_examples(value, expected):
    assert hydra_value(value) == expected
    assert _same(value, hydra_parse(f"k={expected}")[1])


@pytest.mark.parametrize("value", ["a\nb=c", "x\rtrainer.injected=1", "a\u2028trainer.injected=1", "a\x00b"])
def test_hydra_value_refuses_line_breaks(value):
    with pytest.raises(RenderError):
        hydra_value(value)


@pytest.mark.parametrize("value", ["it's", "a,b", "x]", "${oc.env:WANDB_API_KEY}", "a\\", ["a'b", "c,d]", "e\"f"],
                                   "trainer.injected=1"])
def test_verl_override_values_render_as_one_line_each(tmp_path, value):
    run, out = render(tmp_path, changed("a100-verl", {("overrides", "verl"): {"trainer.project_name": value}}))
    assert run.code == 0, run.err
    lines = [line for line in rendered_files(out)["config/verl-overrides.txt"].splitlines()
             if line and not line.startswith("#")]
    parsed = dict(hydra_parse(line) for line in lines)
    assert len(parsed) == len(lines)  # no key twice, no line without a key
    assert _same(value, parsed["trainer.project_name"])
    assert "trainer.injected" not in parsed


@pytest.mark.parametrize(("value", "words"), [
    ("a\nb=c", ("overrides.verl.trainer.project_name",)),
    ({"nested": 1}, ("overrides.verl.trainer.project_name", "expected a number, a boolean, a string")),
    (float("inf"), ("overrides.verl.trainer.project_name",)),
])
def test_verl_override_values_refused(tmp_path, value, words):
    run, out = render(tmp_path, changed("a100-verl", {("overrides", "verl"): {"trainer.project_name": value}}))
    assert_refused(run, words=words)
    assert not out.exists()


@pytest.mark.parametrize("key", ["trainer.x\n", "trainer.x\ntrainer.injected", "trainer.x y", "trainer.x=1",
                                 "os.system"])
def test_verl_override_keys_refused_by_name(tmp_path, key):
    run, out = render(tmp_path, changed("a100-verl", {("overrides", "verl"): {key: 1}}))
    shown = key if key.isprintable() else repr(key)
    assert_refused(run, key=f"overrides.verl.{shown}")
    assert not out.exists()
