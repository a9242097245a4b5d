"""Tests of grpo_deploy.templating: a template value never carries a control character, an env file is plain KEY=VALUE
lines both compose and Kubernetes read alike, and YAML is dumped in the kit's one style."""

from __future__ import annotations

import jinja2
import pytest

from grpo_deploy.templating import RenderError, _finalize, check_env_file, dump_yaml, template


def test_a_value_with_a_control_character_is_refused_and_none_is_empty():
    assert _finalize(None) == "" and _finalize("plain") == "plain" and _finalize(3) == 3
    for bad in ("a\nB=1", "a\rb", "a\x00b", "a\u2028b"):
        with pytest.raises(RenderError, match="control character"):
            _finalize(bad)


def test_a_template_refuses_an_undefined_name():
    with pytest.raises(jinja2.UndefinedError):
        template("host.env.j2")


@pytest.mark.parametrize("line", ["A=$HOME", "A='x'", 'A="x"', "A=x # c", "A=a\\b", "lower-key=1", "1A=x", "=x",
                                  "A x", "-A=1"])
def test_an_env_file_line_that_a_reader_would_change_is_refused(line: str):
    with pytest.raises(RenderError) as exc:
        check_env_file(f"# header\n\nOK=1\n{line}\n", "x.env.j2")
    assert str(exc.value).startswith("x.env.j2:4: refusing to render")


def test_plain_env_lines_pass_and_yaml_keeps_its_order():
    text = "# c\n\nA=1\nB_2=a b/c:d=e\n"
    assert check_env_file(text, "x.env") == text
    assert dump_yaml("# h\n", {"b": 1, "a": [1, 2]}) == "# h\nb: 1\na:\n- 1\n- 2\n"
