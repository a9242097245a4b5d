"""Metrics file: one flushed JSON object per line, appended, NaN-free; and the TRL log callback."""

import json
import math

import pytest

from grpo_deploy.runtime.metrics import MetricsSink, read_events, to_json_value


def test_lines_are_flushed_appended_and_strict_json(tmp_path):
    path = tmp_path / "deep" / "metrics.jsonl"
    sink = MetricsSink(str(path))
    sink.emit("run_start", run_name="r", value=math.nan)
    lines = path.read_text().splitlines()  # readable before close: flushed per line
    record = json.loads(lines[0])
    assert record["event"] == "run_start" and isinstance(record["time"], float) and record["value"] is None
    sink.close()
    with MetricsSink(str(path)) as again:
        again.emit("run_end", status="ok", event="spoofed", time=0)
    events = read_events(str(path))
    assert [e["event"] for e in events] == ["run_start", "run_end"] and events[1]["time"] > 0


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"event": "a", "time": 1}\n{"event": "b", "ti')
    assert [e["event"] for e in read_events(str(path))] == ["a"]


def test_values_become_plain_json():
    torch = pytest.importorskip("torch")
    assert to_json_value(torch.tensor(2.5)) == 2.5
    assert to_json_value({"a": [math.inf, 1]}) == {"a": [None, 1]}
    assert to_json_value(object()).startswith("<object")


def test_callback_writes_steps_and_summary(tmp_path):
    transformers = pytest.importorskip("transformers")
    from grpo_deploy.runtime.callbacks import MetricsCallback

    sink = MetricsSink(str(tmp_path / "m.jsonl"))
    callback = MetricsCallback(sink)
    state = transformers.TrainerState()
    state.global_step = 7
    callback.on_log(None, state, None, logs={"reward": 0.5, "sample/staleness_mean": 1.0, "ratio": math.nan})
    callback.on_log(None, state, None, logs={"train_runtime": 3.0, "train_loss": 0.1})
    sink.close()
    step, summary = read_events(str(tmp_path / "m.jsonl"))
    assert step["event"] == "step" and step["step"] == 7 and step["reward"] == 0.5 and step["ratio"] is None
    assert step["sample/staleness_mean"] == 1.0
    assert summary["event"] == "train_summary" and summary["train_runtime"] == 3.0
