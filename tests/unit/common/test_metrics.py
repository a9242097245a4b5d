"""Metrics file: one flushed JSON object per line, appended, NaN-free, read back defensively; on a real full
filesystem a line that cannot be written goes to stderr and the caller carries on. The TRL log callback:
runtime/trainer/test_callbacks.py."""

import json
import math
import os

import pytest

from grpo_deploy.common.metrics import (
    LINE_LIMIT,
    NUMBER_LIMIT,
    SKIPPED,
    MetricsSink,
    parse_events,
    read_events,
    to_json_value,
)
from tests.unit.runtime.as_root import small_tmpfs


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


def test_read_events_refuses_what_is_not_a_metrics_file_in_one_line(tmp_path):
    """A FIFO, a link, bytes that are not UTF-8: one-line ReadRefused naming the path, never a hang or a traceback."""
    from grpo_deploy.common.readback import ReadRefused

    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    good = tmp_path / "good.jsonl"
    good.write_text('{"event": "run_start", "time": 1}\n')
    link = tmp_path / "link.jsonl"
    link.symlink_to(good)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b'{"event": "x"}\n\xff\xfe')
    for path, says in ((fifo, "FIFO"), (link, "symbolic link"), (binary, "not UTF-8")):
        with pytest.raises(ReadRefused) as refused:
            read_events(str(path))
        assert says in str(refused.value) and "\n" not in str(refused.value)
    assert [e["event"] for e in read_events(str(good))] == ["run_start"]


def test_a_full_disk_does_not_raise_from_emit(tmp_path, capfd):
    with small_tmpfs(tmp_path, "64k") as mnt:
        with MetricsSink(str(mnt / "metrics.jsonl")) as sink:
            sink.emit("step", step=1)
            fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)  # fill the rest of the filesystem
            with pytest.raises(OSError):
                while True:
                    os.write(fd, b"\0" * 4096)
            os.close(fd)
            for step in range(2, 2000):  # past the metrics file's last partly used block
                sink.emit("step", step=step)
            sink.emit("run_end", status="error", error="OSError: [Errno 28] No space left on device")
            assert sink.unwritten > 0
        err = capfd.readouterr().err
        assert '"event":"run_end"' in err and "No space left on device" in err
        assert read_events(str(mnt / "metrics.jsonl"))[0]["step"] == 1


def test_lines_past_a_bound_are_skipped_and_counted_in_one_event():
    """A number longer than NUMBER_LIMIT (10,000 digits: int() would raise past Python's 4,300), one not finite, a line
    over LINE_LIMIT (never parsed), nesting past the recursion limit, an event without a time: each skipped, counted by
    why in one SKIPPED event at the end, stamped with the newest good event's time. A torn line is skipped silently."""
    good = [json.dumps({"event": "step", "time": 5.0 + i, "step": i, "reward": 0.5}) for i in range(2)]
    text = "\n".join([good[0], '{"event":"step","time":1,"r":' + "9" * 10000 + "}", '{"event":"a","time":1e999}',
                      '{"event":"a","time":2,"r":NaN}', '{"event":"a","time":2,"r":-Infinity}',
                      '{"event":"a","time":2,"pad":"' + "x" * (LINE_LIMIT + 1) + '"}',
                      '{"event":"a","time":2,"x":' + "[" * 100000 + "]" * 100000 + "}", '{"event":"a"}',
                      '{"event":"a","time":"soon"}', '{"event":"lines_skipped","time":9,"lines":1,"why":{}}',
                      good[1], '{"event": "b", "ti'])
    events = parse_events(text, "m.jsonl")
    assert [e["event"] for e in events] == ["step", "step", SKIPPED]
    assert events[-1] == {"event": SKIPPED, "time": 6.0, "source": "m.jsonl", "lines": 8,
                          "why": {"a number too long": 1, "a number that is not finite": 3, "a line over 1 MiB": 1,
                                  "a value nested too deep": 1, "an event without a time": 2}}
    assert parse_events("\n".join(good)) == [json.loads(line) for line in good]  # nothing skipped: no SKIPPED event


def test_numbers_up_to_the_bound_and_a_raw_line_separator_in_a_string_are_read():
    line = json.dumps({"event": "a", "time": 1.7e9, "n": -1234567890123456789012345678901,
                       "f": -2.2250738585072014e-308, "s": "one\u2028line"}, ensure_ascii=False)
    (event,) = parse_events(line)
    assert event["n"] == -1234567890123456789012345678901 and event["s"] == "one\u2028line"
    assert len(repr(-2.2250738585072014e-308)) <= NUMBER_LIMIT


def test_read_events_names_the_file_in_its_count(tmp_path):
    path = tmp_path / "deploy.jsonl"
    path.write_text('{"event": "a", "time": 1, "x": NaN}\n')
    assert read_events(str(path))[-1]["source"] == "deploy.jsonl"
