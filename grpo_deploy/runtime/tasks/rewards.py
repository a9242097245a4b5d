"""Reward functions for the trainer: module-level and picklable (they run in TRL's spawned rollout child)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def completion_text(completion) -> str:
    """Text of one completion: TRL passes a list of message dicts for conversational prompts, a string otherwise."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant")


def _truncated(ids: Sequence[int], max_completion_length: int | None) -> bool:
    return max_completion_length is not None and len(ids) >= max_completion_length


def brevity(completions, completion_ids, max_completion_length: int, **kwargs) -> list[float]:
    """1 - len(completion_ids) / max_completion_length: shorter is better, a truncated completion scores 0."""
    return [max(0.0, 1.0 - len(ids) / max_completion_length) for ids in completion_ids]


def last_boxed(text: str) -> str | None:
    r"""Contents of the last `\boxed{...}` in `text` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        brace = start + len("\\boxed")
        while brace < len(text) and text[brace] == " ":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            depth = 0
            for end in range(brace, len(text)):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth == 0:
                    return text[brace + 1 : end]
            return None  # unbalanced: the answer was cut off
        start = text.rfind("\\boxed", 0, start)
    return None


def normalize_answer(answer: str) -> str:
    """Canonical form for comparing short answers: no whitespace, `$`, `\\!`, trailing period, or thousands commas."""
    text = re.sub(r"\s+|\\!|\$", "", answer).rstrip(".")
    text = re.sub(r"^\\text\{(.*)\}$", r"\1", text)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    return text


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def answers_match(predicted: str | None, gold: str | None) -> bool:
    """Equal after normalisation, or numerically equal when both are numbers (so 72.0 matches 72)."""
    if predicted is None or gold is None:
        return False
    predicted, gold = normalize_answer(predicted), normalize_answer(gold)
    if predicted == gold:
        return True
    a, b = _as_number(predicted), _as_number(gold)
    return a is not None and b is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b))


def boxed_match(completions, solution, completion_ids, max_completion_length: int | None = None, **kwargs):
    r"""1 when the last `\boxed{}` answer equals the solution, 0 otherwise or when the completion was truncated."""
    rewards = []
    for completion, gold, ids in zip(completions, solution, completion_ids, strict=True):
        if _truncated(ids, max_completion_length):
            rewards.append(0.0)
            continue
        rewards.append(float(answers_match(last_boxed(completion_text(completion)), str(gold))))
    return rewards


def gsm8k_gold(answer: str) -> str | None:
    """The final answer of a GSM8K solution, the text after `####`, or None when there is none."""
    if "####" not in answer:
        return None
    gold = answer.rsplit("####", 1)[1].strip()
    return gold.replace(",", "").replace("$", "").strip() or None


def predicted_answer(text: str) -> str | None:
    """A completion's answer: its last `\\boxed{}`, else the number after its last `####`, else its last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        numbers = _NUMBER.findall(text.rsplit("####", 1)[1])
        if numbers:
            return numbers[0]
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def gsm8k_answer(completions, answer, completion_ids, max_completion_length: int | None = None, **kwargs):
    """1 when the completion's final number equals GSM8K's `#### N` gold; None (not scorable) when the gold has none."""
    rewards = []
    for completion, gold_text, ids in zip(completions, answer, completion_ids, strict=True):
        gold = gsm8k_gold(str(gold_text))
        if gold is None:
            rewards.append(None)
        elif _truncated(ids, max_completion_length):
            rewards.append(0.0)
        else:
            rewards.append(float(answers_match(predicted_answer(completion_text(completion)), gold)))
    return rewards


REWARDS: dict[str, Callable] = {"brevity": brevity, "boxed_match": boxed_match, "gsm8k_answer": gsm8k_answer}
LENGTH_REWARDS = frozenset({"brevity"})
"""Rewards paid by answer length alone: a run of these alone starts with its answers at the cap by design (the run
watcher's `cap_share: auto` is off for it)."""


def build_reward_funcs(names: Sequence[str], max_completion_length: int) -> list[Callable]:
    """The named rewards bound to the run's completion budget; `functools.partial` of module functions pickles."""
    unknown = [name for name in names if name not in REWARDS]
    if unknown:
        raise ValueError(f"unknown reward(s) {unknown}; registered: {sorted(REWARDS)}")
    return [functools.partial(REWARDS[name], max_completion_length=max_completion_length) for name in names]
