"""Tests of grpo_deploy.common.table."""

from grpo_deploy.common.table import human_bytes, table


def test_table_aligns_and_wraps():
    out = table(["a", "long header"], [["x", "word " * 30]], max_width=60).splitlines()
    assert out[0].startswith("a  long header") and set(out[1]) <= {"-", " "}
    assert len(out) > 3 and all(len(line) <= 60 for line in out)


def test_human_bytes():
    assert human_bytes(13_788_585_984) == "13.8 GB" and human_bytes(None) == "?" and human_bytes(12) == "12 B"


def test_cells_are_printed_without_control_characters():
    from grpo_deploy.common.table import table

    text = table(["host", "health"], [["spark1", "unreachable\x1b[2J: \x1b]0;title\x07docker said\r"]], max_width=120)
    assert text.splitlines()[-1] == "spark1  unreachable: docker said"
