"""grpo_deploy.runtime.verl.data: verl's parquet rows from the kit's tasks, bad rows refused by number, the custom
reward verl loads (real pyarrow files, read back)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from grpo_deploy.runtime.tasks.data import DatasetSpec
from grpo_deploy.runtime.verl import data as verl_data

VERL_COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_rows_carry_the_gold_number_and_the_instruction(tmp_path):
    path = _jsonl(tmp_path / "g.jsonl", [{"question": "2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
                                         {"question": "Half of 1,000?", "answer": "#### 1,000"}])
    rows = verl_data.verl_rows(DatasetSpec(name="gsm8k", path=path, num_prompts=0))
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["5", "1000"]
    assert rows[0]["prompt"] == [{"role": "user", "content": f"2 + 3? {verl_data.INSTRUCTION}"}]
    assert {r["data_source"] for r in rows} == {"openai/gsm8k"} and set(rows[0]) == VERL_COLUMNS


@pytest.mark.parametrize("bad", [{"question": "q"}, {"question": "", "answer": "#### 1"},
                                 {"question": "q", "answer": "no final answer"}, ["not", "an", "object"]])
def test_a_bad_row_is_refused_with_its_number(tmp_path, bad):
    path = _jsonl(tmp_path / "g.jsonl", [{"question": "ok?", "answer": "#### 1"}, bad])
    with pytest.raises(verl_data.BadRow, match=r"g\.jsonl row 2: "):
        verl_data.verl_rows(DatasetSpec(name="gsm8k", path=path, num_prompts=0))


def test_the_cli_writes_train_and_test_parquet_verl_can_read(tmp_path, capsys):
    out = tmp_path / "verl"
    assert verl_data.main(["--dataset", "brevity", "--num-prompts", "20", "--out", str(out)]) == 0
    train, test = (pq.read_table(out / name).to_pylist() for name in verl_data.FILES)
    assert (len(train), len(test)) == (18, 2) and set(train[0]) == VERL_COLUMNS
    assert {r["extra_info"]["split"] for r in test} == {"test"} and train[0]["prompt"][0]["role"] == "user"
    assert "18 train and 2 test rows of brevity" in capsys.readouterr().out


def test_the_cli_refuses_in_one_line_and_writes_nothing(tmp_path, capsys):
    path = _jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "none"}])
    out = tmp_path / "verl"
    assert verl_data.main(["--dataset", "gsm8k", "--path", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "row 1" in err and not (out / "train.parquet").exists()
    assert verl_data.main(["--dataset", "gsm8k", "--path", "relative.jsonl", "--out", str(out)]) == 2
    assert "\n" not in capsys.readouterr().err.strip()


def test_a_link_where_the_data_goes_is_refused(tmp_path):
    target = tmp_path / "elsewhere.parquet"
    target.write_text("the user's")
    (tmp_path / "train.parquet").symlink_to(target)
    with pytest.raises(verl_data.BadRow, match="symbolic link"):
        verl_data.write_parquet([{"a": 1}], str(tmp_path / "train.parquet"))
    assert target.read_text() == "the user's"


def test_compute_score_per_data_source():
    score = verl_data.compute_score
    assert score("grpo-deploy/brevity", "ok", "64") > score("grpo-deploy/brevity", "x" * 40, "64") > 0
    assert score("grpo-deploy/brevity", "x" * 80, "64") == 0.0
    assert score("openai/gsm8k", "so it is 5 apples.\n#### 5", "5") == 1.0
    assert score("openai/gsm8k", "#### 6", "5") == 0.0
    assert score("grpo-deploy/boxed-math", r"thus \boxed{72.0}", "72") == 1.0
    assert score("someone/else", "5", "5") == 0.0
