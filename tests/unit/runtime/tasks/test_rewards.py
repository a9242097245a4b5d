"""Reward functions: values, truncation, answer extraction, and that they pickle as the spawned rollout child needs."""

import pickle

import pytest

from grpo_deploy.runtime.tasks import rewards
from grpo_deploy.runtime.tasks.rewards import boxed_match, brevity, build_reward_funcs, gsm8k_answer, last_boxed


def msg(text):
    return [{"role": "assistant", "content": text}]


def test_brevity_is_one_minus_length_fraction():
    assert brevity([msg("")] * 3, [[1] * 0, [1] * 6, [1] * 24], max_completion_length=24) == [1.0, 0.75, 0.0]


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{3} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed {42}", "42"),
        (r"no box here", None),
        (r"\boxed{unbalanced", None),
        (r"\boxed{a{b}c}", "a{b}c"),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_boxed_match_uses_last_box_and_zeroes_truncated():
    completions = [msg(r"\boxed{1} no wait \boxed{2}"), msg(r"\boxed{1}"), msg(r"\boxed{ 2 }"), msg(r"\boxed{2}")]
    ids = [[0] * 5, [0] * 5, [0] * 5, [0] * 8]
    assert boxed_match(completions, ["2"] * 4, ids, max_completion_length=8) == [1.0, 0.0, 1.0, 0.0]


def test_gsm8k_answer_reads_gold_after_hashes_and_the_last_number():
    gold = "She has 3 + 4 = 7 apples.\n#### 1,234"
    completions = [msg("so 1234"), msg("1,234 is it"), msg(r"\boxed{1234.0} and 5"), msg("12 then 1233"), msg("")]
    result = gsm8k_answer(completions, [gold] * 5, [[0]] * 5, max_completion_length=10)
    assert result == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert gsm8k_answer([msg("7")], ["no final answer"], [[0]]) == [None]
    assert gsm8k_answer([msg("7")], ["#### 7"], [[0] * 10], max_completion_length=10) == [0.0]
    assert gsm8k_answer(["#### -3 apples"], ["#### -3"], [[0]]) == [1.0]  # plain-string completions too


def test_built_rewards_pickle_and_keep_their_names():
    funcs = build_reward_funcs(["brevity", "boxed_match", "gsm8k_answer"], max_completion_length=24)
    restored = pickle.loads(pickle.dumps(funcs))
    assert [f.func.__name__ for f in restored] == ["brevity", "boxed_match", "gsm8k_answer"]
    assert restored[0]([msg("")], completion_ids=[[0] * 12]) == [0.5]


def test_unknown_reward_is_rejected():
    with pytest.raises(ValueError, match="unknown reward"):
        build_reward_funcs(["brevity", "nope"], 8)


def test_registry_functions_are_module_level():
    for name, func in rewards.REWARDS.items():
        assert getattr(rewards, func.__name__) is func, name
