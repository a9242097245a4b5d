"""Tests of grpo_deploy.yamlpos: line numbers for keys and items."""

from grpo_deploy.yamlpos import load_text


def test_lines_of_nested_keys_and_items():
    doc = load_text("a: 1\nb:\n  c: 2\n  d:\n    - x\n    - y: 3\n", source="f.yaml")
    assert doc.line_of(("b", "c")) == 3
    assert doc.line_of(("b", "d", 1)) == 6
    assert doc.line_of(("b", "d", 1, "y")) == 6
    assert doc.where(("b", "missing")) == "f.yaml:2"  # falls back to the nearest known parent
