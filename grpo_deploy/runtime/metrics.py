"""The metrics sink: an append-only JSONL file, one event object per line, flushed as each line is written."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import Any


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
    """Writes `{"event": ..., "time": <unix float>, ...}` lines to `path`, appending across runs and resumes."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def emit(self, event: str, /, **fields: Any) -> dict:
        record = event_record(event, **fields)
        line = event_line(record)
        with self._lock:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except OSError as error:  # the shared volume went away or read-only: the container log keeps the event
                sys.stderr.write(f"metrics: could not write {self.path} ({error}); event: {line}\n")
                sys.stderr.flush()
        return record

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                try:
                    os.fsync(self._file.fileno())
                    self._file.close()
                except OSError as error:
                    sys.stderr.write(f"metrics: could not close {self.path}: {error}\n")

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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


def read_events(path: str) -> list[dict]:
    """Every event in a metrics file."""
    with open(path, encoding="utf-8") as handle:
        return parse_events(handle.read())
