"""Tests of grpo_deploy.image_build.door: each flag value of `grpo-deploy images` checked into its type, a hostile one
refused as a BadValue of one line (through the CLI: tests/unit/image_build/test_cli.py)."""

from __future__ import annotations

import pytest

from grpo_deploy.image_build import door


@pytest.mark.parametrize("value", ["grpo-deploy/cpu:0.1.0", "localhost:5000/team/grpo_x:1.2-cu130_arm64", "a:B"])
def test_good_tags_pass(value: str):
    assert door.image_tag(value) == value


def test_good_ids_and_paths_pass():
    assert door.run_id("1") == 1 and door.run_id("2147483646") == 2147483646
    assert door.checked_path("build/wheelhouse/cpu") == "build/wheelhouse/cpu"
    assert door.checked_path("/abs/a..b/c") == "/abs/a..b/c"


@pytest.mark.parametrize(("value", "problem"), [
    ("", "empty"), ("a\nb", "a control character"), ("a\tb", "a control character"), ("-rf", "a leading '-'"),
    ("..", "a '..' part"), ("x/../y", "a '..' part"), ("$HOME/x", "'$' or a backquote"),
    ("a`id`", "'$' or a backquote"),    ("a" * 4097, "over 4096 characters"),
])
def test_a_hostile_path_is_refused_saying_what_it_has(value: str, problem: str):
    with pytest.raises(door.BadValue) as exc:
        door.checked_path(value)
    assert f"it has {problem}" in str(exc.value) and "\n" not in str(exc.value)
    assert len(str(exc.value)) < 300  # the value is shown by a short prefix, never whole


@pytest.mark.parametrize("value", ["0", "-1", "2147483647", "1e3", " 5", "5\n", "٣"])
def test_root_and_out_of_range_ids_are_refused(value: str):
    with pytest.raises(door.BadValue, match="is not a non-root id"):
        door.run_id(value)


def test_suites_architectures_and_mirrors_pass_only_as_known():
    assert door.base_suite("noble") == "noble" and door.base_arch("arm64") == "arm64"
    assert door.mirror_url("http://deb.debian.org/debian") == "http://deb.debian.org/debian"
    assert door.mirror_url("file:///srv/mirror") == "file:///srv/mirror"
    for check, value in ((door.base_suite, "noble\n"), (door.base_arch, "aarch64"), (door.base_arch, "-arm64"),
                         (door.mirror_url, "http://h/../x"), (door.mirror_url, "http://h/a b"),
                         (door.mirror_url, "-http://h"), (door.image_tag, "grpo/cpu:1\n"),
                         (door.image_tag, "grpo-deploy/../cpu:1")):
        with pytest.raises(door.BadValue):
            check(value)
