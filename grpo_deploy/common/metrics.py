"""The metrics sink: an append-only JSONL file, one event object per line, flushed as each line is written."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import Any

from grpo_deploy.common.readback import MiB, read_text


def to_json_value(value: Any) -> Any:
    """Plain JSON for a logged value: NaN and infinities become null, tensors and numpy scalars become numbers."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def event_record(event: str, /, **fields: Any) -> dict:
    """One event: `{"event", "time"}` envelope first (a field named like them never overrides it), values as JSON."""
    record = {"event": event, "time": time.time()}
    for key, value in fields.items():
        if key not in record:
            record[key] = to_json_value(value)
    return record


def event_line(record: dict) -> str:
    return json.dumps(record, allow_nan=False, separators=(",", ":"))


class MetricsSink:
    """Writes `{"event": ..., "time": <unix float>, ...}` lines to `path`, appending across runs and resumes.

    Each line is one append (`os.write` on an O_APPEND descriptor). A line that cannot be written (the disk is full:
    the very fault the watchdog and the fault suite are about) goes to stderr, into the container's log, instead of
    raising — the trainer's own error and its `run_end` must not be replaced by the metrics file's ENOSPC."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._lock = threading.Lock()
        self.unwritten = 0

    def emit(self, event: str, /, **fields: Any) -> dict:
        record = event_record(event, **fields)
        line = event_line(record) + "\n"
        with self._lock:
            try:
                if self._fd is None:
                    raise OSError(f"{self.path} is closed")
                os.write(self._fd, line.encode("utf-8"))
            except OSError as error:
                self.unwritten += 1
                print(f"metrics: not written to {self.path} ({error}): {line}", end="", file=sys.stderr, flush=True)
        return record

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.fsync(fd)
                except OSError:
                    pass
                os.close(fd)

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NullSink:
    """A sink that writes nothing: trainer ranks other than 0 (rank 0 speaks for the group)."""

    unwritten = 0

    def emit(self, event: str, /, **fields: Any) -> dict:
        return event_record(event, **fields)

    def close(self) -> None:
        pass


def parse_events(text: str) -> list[dict]:
    """Events from JSONL text, skipping a torn last line (the writer may have died mid-line) and non-events."""
    events = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "event" in record:
            events.append(record)
    return events


METRICS_READ_LIMIT = 256 * MiB  # ~500,000 steps of events; a larger "metrics file" is not one


def read_events(path: str) -> list[dict]:
    """Every event in a metrics file, read through the bounded reader (a link, FIFO, device, huge or non-UTF-8 file
    is a one-line ReadRefused, never a hang or a traceback)."""
    return parse_events(read_text(path, METRICS_READ_LIMIT, "a metrics file"))
