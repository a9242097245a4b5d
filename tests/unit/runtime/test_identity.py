"""Umask handling shared by the entrypoints."""

import os

import pytest

from grpo_deploy.runtime.identity import apply_umask, format_mode, identity, parse_umask


@pytest.fixture
def restore_umask():
    previous = os.umask(0o022)
    os.umask(previous)
    yield
    os.umask(previous)


@pytest.mark.parametrize("text, value", [("0022", 0o022), ("022", 0o022), ("77", 0o077), (" 0002 ", 0o002)])
def test_parse_umask(text, value):
    assert parse_umask(text) == value


@pytest.mark.parametrize("text", ["abc", "0999", "1777", ""])
def test_parse_umask_rejects(text):
    with pytest.raises(ValueError, match="GRPO_UMASK"):
        parse_umask(text)


def test_apply_umask_from_env_and_default(restore_umask):
    assert apply_umask({"GRPO_UMASK": "0077"}) == 0o077 and identity()["umask"] == "0077"
    assert apply_umask({}) == 0o022 and identity()["umask"] == "0022"
    assert identity()["uid"] == os.getuid() and format_mode(0o100644) == "0644"
