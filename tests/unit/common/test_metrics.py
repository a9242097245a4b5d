"""Metrics file: one flushed JSON object per line, appended, NaN-free, read back defensively; on a real full
filesystem a line that cannot be written goes to stderr and the caller carries on. The TRL log callback:
runtime/trainer/test_callbacks.py."""

import json
import math
import os

import pytest

from grpo_deploy.common.metrics import MetricsSink, read_events, to_json_value
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
