"""Tests of grpo_deploy.common.values: the value types of the kit's input door (paths, addresses, env values, names,
image references) take a good value and refuse a hostile one (a newline, '..', a leading '-', '$') with one line."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from grpo_deploy.common import values


def _check(kind, value):
    return TypeAdapter(kind).validate_python(value, strict=False)


def test_abs_path_trims_a_trailing_slash_and_refuses_what_is_not_normal():
    assert values.abs_path("/shared/") == "/shared" and values.abs_path("/") == "/"
    for bad in ("shared", "/a/../b", "/a//b", "/a/./b", "/a\nb", "/a b", "/a:b", "/$HOME", "/a\u202eb"):
        with pytest.raises(ValueError) as exc:
            values.abs_path(bad)
        assert "\n" not in str(exc.value), bad


def test_own_path_refuses_system_directories_and_the_kits_own_paths():
    assert _check(values.OwnPath, "/srv/grpo-deploy") == "/srv/grpo-deploy"
    for bad in ("/", "/etc/x", "/tmp", "/opt/venv/lib", "/home"):
        with pytest.raises(ValidationError):
            _check(values.OwnPath, bad)


def test_parse_address_splits_user_host_and_port():
    assert values.parse_address("me@spark1:2222") == values.SshTarget("me", "spark1", 2222)
    assert values.parse_address("[fe80::1]:22") == values.SshTarget(None, "fe80::1", 22)
    assert values.parse_address("fe80::1") == values.SshTarget(None, "fe80::1", None)
    assert values.host_part("local") == "" and values.host_part("u@h:1") == "h"
    assert values.ip_literal("10.0.0.1") == "10.0.0.1" and values.ip_literal("spark1") is None


@pytest.mark.parametrize("bad", ["-oProxyCommand=x", "h\nx", "h:0", "h:65536", "h:２２", "bad user@h", "[::1",
                                 "[zz::1]:22", "h/x", ""])
def test_parse_address_refuses_a_hostile_address(bad: str):
    with pytest.raises(ValueError):
        values.parse_address(bad)


def test_env_values_are_plain_text_both_readers_agree_on():
    assert values.env_text(True) == "1" and values.env_text(3) == "3" and values.env_text("x") == "x"
    assert _check(values.EnvValue, False) == "0"
    for bad in ("$HOME", "a'b", 'a"b', "a#b", "a\\b", "a\nB=1", "`id`"):
        with pytest.raises(ValidationError):
            _check(values.EnvValue, bad)
    with pytest.raises(ValueError):
        values.env_text(float("nan"))


def test_resume_is_auto_never_or_an_absolute_path():
    assert values.resume_value("auto") == "auto" and values.resume_value("/shared/ck/") == "/shared/ck"
    for bad in ("latest", "../ck", "/shared/../etc", "-x"):
        with pytest.raises(ValueError):
            values.resume_value(bad)


def test_names_models_and_numbers():
    assert _check(values.Name, "run-1") == "run-1" and _check(values.ModelRef, "Qwen/Qwen2.5-0.5B")
    for kind, bad in ((values.Name, "-run"), (values.Name, "Run"), (values.ModelRef, "../etc/passwd"),
                      (values.ModelRef, "a/b/c"), (values.ServedName, "x\ny"), (values.Uid, 0), (values.Uid, True),
                      (values.Port, 70000), (values.HydraKey, "a.b; rm"), (values.EnvName, "lower")):
        with pytest.raises(ValidationError):
            _check(kind, bad)
