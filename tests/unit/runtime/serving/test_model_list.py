"""A vLLM server's model list read as input: its entries bounded and typed, junk left out, and the base model's name
(an adapter's parent, else the one entry that is no adapter)."""

from __future__ import annotations

from grpo_deploy.runtime.serving import model_list

BASE = "tiny-qwen2"


def test_entries_keep_vllms_shape_and_leave_junk_out():
    answer = {"data": [{"id": BASE}, {"id": "trl-policy-v1", "parent": BASE}, {"id": 3}, "x",
                       {"id": "y" * 2000}, {"id": "z", "parent": ["not", "a", "name"]}]}
    assert model_list.entries(answer) == {BASE: None, "trl-policy-v1": BASE, "z": None}
    assert model_list.entries({"data": "no list"}) is None and model_list.entries([1]) is None
    assert len(model_list.entries({"data": [{"id": str(i)} for i in range(20_000)]})) == model_list.MAX_ENTRIES


def test_the_base_is_the_adapters_parent_else_the_one_entry_that_is_no_adapter():
    assert model_list.base_of({BASE: None, "trl-policy-v1": BASE}, "trl-policy-v1") == BASE
    assert model_list.base_of({BASE: None, "trl-policy-v1": None}) == BASE
    assert model_list.base_of({"a": None, "b": None}) is None  # two candidates: none named
    assert model_list.base_of({}) is None
