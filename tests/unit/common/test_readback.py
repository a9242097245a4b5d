"""Tests of grpo_deploy.common.readback: the one bounded reader of files the kit did not write refuses a link, a FIFO,
a directory, an oversized or non-UTF-8 file, each with its kind and one line (more cases: tests/hostile)."""

from __future__ import annotations

import os

import pytest

from grpo_deploy.common.readback import ReadRefused, decode, read_bytes, read_text, shown_path


def _refused(path, limit=100, **kw) -> ReadRefused:
    with pytest.raises(ReadRefused) as exc:
        read_bytes(path, limit, "the spec", **kw)
    assert "\n" not in str(exc.value)
    return exc.value


def test_a_regular_file_is_read_within_its_limit(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("a: 1\n")
    assert read_text(f, 100) == "a: 1\n" and read_bytes(f, 5) == b"a: 1\n"


def test_a_link_a_fifo_a_directory_and_a_missing_file_are_refused(tmp_path):
    target = tmp_path / "real"
    target.write_text("x")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    assert _refused(tmp_path / "link").kind == "link"
    assert _refused(tmp_path / "fifo").kind == "not-regular"  # and it did not block waiting for a writer
    assert _refused(tmp_path).kind == "not-regular"
    assert _refused(tmp_path / "nothing").kind == "missing"
    assert _refused(str(tmp_path / "a\x00b")).kind == "unreadable"


def test_an_oversized_file_is_refused_or_cut_to_its_head(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"y" * 101)
    refusal = _refused(big)
    assert refusal.kind == "too-big" and refusal.size == 101 and "101 bytes" in str(refusal)
    assert read_bytes(big, 10, head=True) == b"y" * 10


def test_text_that_is_not_utf8_names_its_line_not_its_bytes(tmp_path):
    with pytest.raises(ReadRefused) as exc:
        decode(b"ok\nsecret\xff\n", "f.yaml")
    assert exc.value.kind == "not-utf8" and str(exc.value).startswith("f.yaml:2:") and "secret" not in str(exc.value)
    assert shown_path("a\nb") == repr("a\nb") and shown_path("plain") == "plain"
