"""Training prompts: the synthetic `brevity` task, and boxed-math / GSM8K files, as conversational datasets."""

from __future__ import annotations

import json
import os
import random
from typing import Literal

from pydantic import Field

from grpo_deploy.common.strict import Strict
from grpo_deploy.common.values import AbsPath

DATASETS = ("brevity", "boxed-math", "gsm8k")

_SUBJECTS = (
    "the sea|a red fox|rain|the moon|old trees|a train|bread|winter|a small boat|music|"
    "the desert|a clock|honey|the wind|a lighthouse|paper|snow|a garden|the river|stars"
).split("|")
_ASKS = ["Describe {}.", "Tell me about {}.", "What is {}?", "Say something about {}.", "Write a line on {}."]


class DatasetSpec(Strict):
    """Which prompts the trainer reads."""

    name: Literal["brevity", "boxed-math", "gsm8k"] = "brevity"
    """brevity (synthetic, no file) | boxed-math | gsm8k (JSONL files)."""
    path: AbsPath | None = None
    """The dataset file inside the containers (boxed-math, gsm8k)."""
    num_prompts: int | None = Field(64, ge=0)
    """Prompts used; 0 or null = every prompt in the file (brevity: 64)."""


def user_prompt(text: str) -> list[dict]:
    """A one-turn conversational prompt, the form TRL's rollout worker applies the chat template to."""
    return [{"role": "user", "content": text}]


def brevity_rows(num_prompts: int, seed: int = 0) -> list[dict]:
    """Deterministic short requests; the reward only looks at completion length, so content is incidental."""
    combos = [ask.format(subject) for subject in _SUBJECTS for ask in _ASKS]
    random.Random(seed).shuffle(combos)
    return [{"prompt": user_prompt(combos[i % len(combos)])} for i in range(num_prompts)]


def read_records(path: str) -> list[dict]:
    """Rows of a JSONL (`.jsonl`/`.json` lines) or Parquet file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file {path} does not exist")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not a JSON object ({error.msg})") from None
    return rows


def _require(row: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [key for key in keys if key not in row]
    if missing:
        raise ValueError(f"{where}: missing column(s) {missing}; have {sorted(row)}")


def _as_prompt(value) -> list[dict]:
    return user_prompt(value) if isinstance(value, str) else list(value)


def boxed_math_rows(records: list[dict], path: str) -> list[dict]:
    rows = []
    for i, record in enumerate(records):
        _require(record, ("prompt", "solution"), f"{path} row {i}")
        rows.append({"prompt": _as_prompt(record["prompt"]), "solution": str(record["solution"])})
    return rows


def gsm8k_rows(records: list[dict], path: str) -> list[dict]:
    rows = []
    for i, record in enumerate(records):
        _require(record, ("question", "answer"), f"{path} row {i}")
        rows.append({"prompt": user_prompt(record["question"]), "answer": record["answer"]})
    return rows


def build_rows(spec: DatasetSpec, seed: int = 0) -> list[dict]:
    """Prompt rows (`prompt` plus the columns the task's reward reads), capped at `num_prompts`."""
    if spec.name == "brevity":
        return brevity_rows(spec.num_prompts or 64, seed)
    if spec.name not in DATASETS:
        raise ValueError(f"unknown dataset {spec.name!r}; use one of {', '.join(DATASETS)}")
    if not spec.path:
        raise ValueError(f"dataset {spec.name} needs a path")
    records = read_records(spec.path)
    rows = boxed_math_rows(records, spec.path) if spec.name == "boxed-math" else gsm8k_rows(records, spec.path)
    if not rows:
        raise ValueError(f"dataset file {spec.path} has no rows")
    return rows[: spec.num_prompts] if spec.num_prompts else rows


def build_dataset(spec: DatasetSpec, seed: int = 0):
    """The rows as a `datasets.Dataset`, which TRL's rollout worker iterates."""
    from datasets import Dataset

    return Dataset.from_list(build_rows(spec, seed))
