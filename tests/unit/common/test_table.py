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


def test_no_line_is_wider_than_the_table_and_a_long_path_breaks_after_a_slash():
    path = "/shared/runs/rehearsal/.preflight-probe/probe-1000/adapter_model.safetensors"
    cell = f"probe {path} written on local as 1000:1000 (file 0600) and read on local as 1000:1000"
    out = table(["check", "host", "verdict", "fact / fix"], [["shared-volume", "local", "OK", cell]],
                max_width=80).splitlines()
    assert max(len(line) for line in out) <= 80, out
    column = out[0].index("fact / fix")
    assert all(line.startswith(" " * (column + 2)) and line[column + 2] != " " for line in out[3:]), out
    pieces = [out[2][column:]] + [line.strip() for line in out[3:]]
    assert "".join(p if p.endswith("/") else p + " " for p in pieces).strip() == cell, "nothing lost, path whole"
    assert any(p.endswith("/") for p in pieces), "the path was broken after a slash"
