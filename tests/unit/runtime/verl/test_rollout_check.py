"""verl's side of the served-policy check (runtime/verl/rollout_check.py): the rule over verl's per-step gap between
the rollout's and the actor's probabilities of the rollout's own answers."""

from __future__ import annotations

import math

import pytest

from grpo_deploy.runtime.verl.rollout_check import AFTER, MAX_KEY, MEAN_KEY, VALID_KEY, RolloutGapRule


def gap(mean, peak=None, valid=1) -> dict:
    return {MEAN_KEY: mean, MAX_KEY: mean * 20 if peak is None and isinstance(mean, float) else peak, VALID_KEY: valid}


def judge_all(rule: RolloutGapRule, means) -> list:
    return [rule.judge(n, gap(m)) for n, m in enumerate(means, 1)]


def test_a_rollout_in_step_with_its_actor_is_never_a_finding():
    # the CPU rehearsal's numerics (9.2e-5 to 9.7e-5 measured), here noisier: 1x-5x of 9e-5, for 200 steps
    means = [9e-5 * (1 + 4 * ((n * 7919) % 13) / 12) for n in range(200)]
    verdicts = judge_all(RolloutGapRule(), means)
    assert [v.verdict for v in verdicts[:3]] == ["floor"] * 3
    assert {v.verdict for v in verdicts[3:]} == {"in-step"} and not any(v.finding for v in verdicts)


def test_a_bf16_rollout_near_the_tolerance_is_judged_against_its_own_floor():
    verdicts = judge_all(RolloutGapRule(), [2e-3, 3e-3, 2.5e-3] + [8e-3] * 50)  # 3x its floor, over the tolerance
    assert not any(v.finding for v in verdicts) and verdicts[-1].threshold == pytest.approx(2.5e-2)


def test_one_unusually_low_early_step_does_not_lower_the_threshold():
    rule = RolloutGapRule()
    judge_all(rule, [2.5e-3, 1e-6, 3e-3])  # the median, not the smallest: 2.5e-3
    assert rule.floor == 2.5e-3 and rule.threshold() == pytest.approx(2.5e-2)


def test_a_rollout_left_behind_is_a_finding_after_three_steps_once_then_clears():
    rule = RolloutGapRule()
    verdicts = judge_all(rule, [1e-7, 2e-7, 1e-7, 1e-7] + [0.004, 0.006, 0.009, 0.012, 0.015] + [1e-7])
    off = [n for n, v in enumerate(verdicts, 1) if v.verdict == "off-policy"]
    assert off == [5, 6, 7, 8, 9]
    found = [(n, v.finding) for n, v in enumerate(verdicts, 1) if v.finding]
    assert len(found) == 1 and found[0][0] == 4 + AFTER  # the third step in a row
    values = found[0][1]
    assert values["verdict"] == "rollout-gap" and values["gap_mean"] == 0.009 and values["steps"] == AFTER
    assert values["floor"] == 1e-7 and values["threshold"] == 1e-3 and values["gap_max"] == pytest.approx(0.18)
    assert verdicts[-1].verdict == "in-step" and verdicts[-1].clear


def test_two_steps_over_then_one_under_starts_the_count_again():
    verdicts = judge_all(RolloutGapRule(), [1e-7] * 3 + [0.01, 0.01, 1e-7, 0.01, 0.01, 1e-7])
    assert not any(v.finding for v in verdicts)


@pytest.mark.parametrize("bad", [None, "0.5", True, float("nan"), float("inf"), -1.0, [0.1], {"x": 1}])
def test_a_step_without_a_usable_gap_is_not_judged_and_keeps_the_count(bad):
    rule = RolloutGapRule()
    judge_all(rule, [1e-7] * 3 + [0.01, 0.01])
    verdict = rule.judge(6, {MEAN_KEY: bad, MAX_KEY: bad})
    assert verdict.verdict == "unknown" and verdict.streak == 2 and verdict.finding is None
    assert rule.judge(7, gap(0.01)).finding is not None  # the third judged step in a row


def test_verls_invalid_marker_and_a_missing_gap_are_unknown():
    rule = RolloutGapRule()
    assert rule.judge(1, gap(math.nan, valid=0)).verdict == "unknown"
    assert rule.judge(2, {"reward": 0.5}).verdict == "unknown"
    assert rule.floor is None  # neither set the floor


def test_a_finding_lasts_while_the_gap_hovers_just_under_the_line_and_clears_well_under_it():
    rule = RolloutGapRule()
    verdicts = judge_all(rule, [1e-7] * 3 + [0.01] * 3 + [9e-4, 0.01, 9.5e-4, 7e-4])  # threshold 1e-3
    assert [n for n, v in enumerate(verdicts, 1) if v.finding] == [6]  # once: no second finding at step 8
    assert [n for n, v in enumerate(verdicts, 1) if v.clear] == [10]  # 7e-4 is under 0.8 of the threshold
