"""Tests of grpo_deploy.common.table."""

from grpo_deploy.common.table import human_bytes, table


def test_table_aligns_and_wraps():
    out = table(["a", "long header"], [["x", "word " * 30]], max_width=60).splitlines()
    assert out[0].startswith("a  long header") and set(out[1]) <= {"-", " "}
    assert len(out) > 3 and all(len(line) <= 60 for line in out)


def test_human_bytes():
    assert human_bytes(13_788_585_984) == "13.8 GB" and human_bytes(None) == "?" and human_bytes(12) == "12 B"
