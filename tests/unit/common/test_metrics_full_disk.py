"""The metrics sink on a real full filesystem: a line that cannot be written goes to stderr, the caller carries on."""

import os

import pytest

from grpo_deploy.common.metrics import MetricsSink, read_events
from tests.unit.runtime.as_root import small_tmpfs


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
