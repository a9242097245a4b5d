"""Prompt datasets: the synthetic brevity task and boxed-math / GSM8K files."""

import json

import pytest

from grpo_deploy.runtime.tasks.data import DatasetSpec, brevity_rows, build_dataset, build_rows


def test_brevity_rows_are_conversational_ascii_and_deterministic():
    rows = brevity_rows(64, seed=0)
    assert len(rows) == 64 and rows == brevity_rows(64, seed=0) and rows != brevity_rows(64, seed=1)
    for row in rows:
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].isascii() and message["content"]
    assert len(brevity_rows(300)) == 300  # cycles past the distinct prompts


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_boxed_math_from_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "1+1?", "solution": 2}, {"prompt": "2+2?", "solution": "4"}])
    rows = build_rows(DatasetSpec(name="boxed-math", path=path, num_prompts=1))
    assert rows == [{"prompt": [{"role": "user", "content": "1+1?"}], "solution": "2"}]


def test_gsm8k_from_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = str(tmp_path / "g.parquet")
    pq.write_table(pa.table({"question": ["q1", "q2"], "answer": ["x #### 3", "y #### 4"]}), path)
    dataset = build_dataset(DatasetSpec(name="gsm8k", path=path, num_prompts=None))
    assert dataset.column_names == ["prompt", "answer"] and len(dataset) == 2
    assert dataset[1]["prompt"] == [{"role": "user", "content": "q2"}]


def test_missing_column_and_bad_line_name_the_file(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "q"}])
    with pytest.raises(ValueError, match=r"g.jsonl row 0: missing column\(s\) \['answer'\]"):
        build_rows(DatasetSpec(name="gsm8k", path=path))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "solution": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        build_rows(DatasetSpec(name="boxed-math", path=str(bad)))
    with pytest.raises(FileNotFoundError):
        build_rows(DatasetSpec(name="gsm8k", path=str(tmp_path / "absent.jsonl")))
