"""verl's training data and reward for the kit's tasks: rows in verl's parquet schema (`data_source`, `prompt`,
`ability`, `reward_model.ground_truth`, `extra_info`) from the same task sources as the TRL trainer's
(grpo_deploy.runtime.tasks.data), train and test files written on the share, and `compute_score`, the custom reward
function verl loads from this file (`reward.custom_reward_function.path` / `.name`).

    python3 -m grpo_deploy.runtime.verl.data --dataset gsm8k --path /shared/data/gsm8k.jsonl --out /shared/data/verl

A bad row is refused with its row number; nothing is written then.
"""

from __future__ import annotations

import argparse
import os
import sys

# Absolute imports: verl loads this file by its path (a module without a package), not as grpo_deploy.runtime.verl.data.
from grpo_deploy.runtime.tasks.data import DATASETS, DatasetSpec, brevity_rows, read_records, user_prompt
from grpo_deploy.runtime.tasks.rewards import answers_match, gsm8k_gold, last_boxed, predicted_answer

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
"""Appended to every GSM8K question, as verl's own GSM8K preprocessing does (seed 000: plain chain of thought)."""
SOURCES = {"brevity": "grpo-deploy/brevity", "gsm8k": "openai/gsm8k", "boxed-math": "grpo-deploy/boxed-math"}
"""The `data_source` each task's rows carry: compute_score picks the rule by it."""
BREVITY_CHARS = 64
"""The brevity task's limit: a completion scores 1 - characters / limit (0 at or past it), the limit in the row."""
FILES = ("train.parquet", "test.parquet")


class BadRow(ValueError):
    """A dataset row verl cannot train on: the file, the row number (1-based) and what is wrong."""


def _row(task: str, prompt: list[dict], ground_truth: str, split: str, index: int) -> dict:
    return {"data_source": SOURCES[task], "prompt": prompt, "ability": "math" if task != "brevity" else "style",
            "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": split, "index": index}}


def verl_rows(spec: DatasetSpec, seed: int = 0) -> list[dict]:
    """Every prompt of the task as a verl row (split "train"; split_rows makes the test share), at most num_prompts."""
    if spec.name == "brevity":
        return [_row("brevity", r["prompt"], str(BREVITY_CHARS), "train", i)
                for i, r in enumerate(brevity_rows(spec.num_prompts or 64, seed))]
    if spec.name not in DATASETS or not spec.path:
        raise BadRow(f"dataset {spec.name!r} needs one of {', '.join(DATASETS)} and, for files, a path")
    records = read_records(spec.path)
    rows = []
    for i, record in enumerate(records):
        where = f"{spec.path} row {i + 1}"
        if not isinstance(record, dict):
            raise BadRow(f"{where}: not an object")
        if spec.name == "gsm8k":
            question, answer = record.get("question"), record.get("answer")
            gold = gsm8k_gold(answer) if isinstance(answer, str) else None
            if not isinstance(question, str) or not question.strip() or gold is None:
                raise BadRow(f"{where}: needs a non-empty 'question' and an 'answer' ending in '#### <number>'")
            rows.append(_row("gsm8k", user_prompt(f"{question.strip()} {INSTRUCTION}"), gold, "train", i))
        else:
            prompt, solution = record.get("prompt"), record.get("solution")
            if not isinstance(prompt, str) or not prompt.strip() or solution in (None, ""):
                raise BadRow(f"{where}: needs a non-empty 'prompt' and a 'solution'")
            rows.append(_row("boxed-math", user_prompt(prompt.strip()), str(solution), "train", i))
    if not rows:
        raise BadRow(f"{spec.path}: no rows")
    return rows[: spec.num_prompts] if spec.num_prompts else rows


def split_rows(rows: list[dict], test_fraction: float) -> tuple[list[dict], list[dict]]:
    """(train, test): the last *test_fraction* of the rows (at least one when there are two or more) for validation."""
    n_test = min(len(rows) - 1, max(1, round(len(rows) * test_fraction))) if len(rows) > 1 and test_fraction else 0
    train, test = rows[: len(rows) - n_test], rows[len(rows) - n_test:]
    for row in test:
        row["extra_info"] = {**row["extra_info"], "split": "test"}
    return train, test


def write_parquet(rows: list[dict], path: str) -> None:
    """*rows* to a parquet file, written beside it then renamed (a reader never sees half a file); a link at *path*
    is refused, not followed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.islink(path):
        raise BadRow(f"{path} is a symbolic link: the data is written to a real file; remove the link")
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's custom reward: brevity by length against the row's limit; GSM8K by the number after `####` (else the
    last number); boxed math by the last `\\boxed{}`. A data source the kit does not know scores 0."""
    text = solution_str or ""
    if data_source == SOURCES["brevity"]:
        limit = int(ground_truth) if str(ground_truth).isdigit() and int(ground_truth) > 0 else BREVITY_CHARS
        return max(0.0, 1.0 - len(text.strip()) / limit)
    if data_source == SOURCES["gsm8k"]:
        return float(answers_match(predicted_answer(text), str(ground_truth)))
    if data_source == SOURCES["boxed-math"]:
        return float(answers_match(last_boxed(text), str(ground_truth)))
    return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.verl.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=DATASETS, default="brevity")
    parser.add_argument("--path", default=None, help="the task's JSONL or parquet file (gsm8k, boxed-math)")
    parser.add_argument("--num-prompts", type=int, default=None, help="rows used (default: all; brevity 64)")
    parser.add_argument("--test-fraction", type=float, default=0.1, help="the share of rows kept for validation")
    parser.add_argument("--out", required=True, help="the folder for train.parquet and test.parquet")
    args = parser.parse_args(argv)
    if not 0 <= args.test_fraction < 1:
        parser.error("--test-fraction must be in [0, 1)")
    try:
        spec = DatasetSpec(name=args.dataset, path=args.path, num_prompts=args.num_prompts)
        train, test = split_rows(verl_rows(spec), args.test_fraction)
        os.makedirs(args.out, exist_ok=True)
        for name, rows in zip(FILES, (train, test), strict=True):
            if rows:
                write_parquet(rows, os.path.join(args.out, name))
    except (BadRow, ValueError, OSError) as exc:
        print(f"verl data: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, whatever said it
        return 2
    print(f"verl data: {len(train)} train and {len(test)} test rows of {args.dataset} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
