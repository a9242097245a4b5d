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


LINE_LIMIT = MiB  # one event is a few hundred bytes (a step of verl's, a few KB); a longer line is not one
NUMBER_LIMIT = 32  # characters of one number: a float's repr is at most 24, a byte count 20
SKIPPED = "lines_skipped"
"""The event parse_events adds for the lines it refused: {source, lines, why: {reason: count}}."""


class _Refused(ValueError):
    """A line that parses as JSON but is not read as an event: *why* says which bound it broke."""


def _bounded(convert):
    def number(text: str):
        if len(text) > NUMBER_LIMIT:
            raise _Refused("a number too long")
        value = convert(text)
        if not math.isfinite(value):
            raise _Refused("a number that is not finite")
        return value
    return number


def _not_finite(name: str):
    raise _Refused("a number that is not finite")


# JSON as an events file holds it: numbers of at most NUMBER_LIMIT characters, finite (never NaN or Infinity).
_DECODER = json.JSONDecoder(parse_int=_bounded(int), parse_float=_bounded(float), parse_constant=_not_finite)


def _event(line: str) -> dict | None:
    """The event on *line*; None for what is not one (a torn line, another record); _Refused past a bound."""
    if len(line) > LINE_LIMIT:
        raise _Refused("a line over 1 MiB")
    try:
        record = _DECODER.decode(line)
    except json.JSONDecodeError:
        return None
    except RecursionError:
        raise _Refused("a value nested too deep") from None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str) or record["event"] == SKIPPED:
        return None  # not an event (a SKIPPED event is the reader's word, never a file's)
    when = record.get("time")
    if not isinstance(when, int | float) or isinstance(when, bool):
        raise _Refused("an event without a time")
    return record


def parse_events(text: str, source: str = "metrics.jsonl") -> list[dict]:
    """Events from JSONL text, skipping a torn last line (the writer may have died mid-line) and non-events. A line
    the kit will not read as an event — longer than LINE_LIMIT, a number longer than NUMBER_LIMIT or not finite,
    nested too deep, no time — is counted, never raised: one SKIPPED event at the end says how many and why."""
    events: list[dict] = []
    why: dict[str, int] = {}
    for line in text.split("\n"):
        try:
            record = _event(line)
        except _Refused as refused:
            why[str(refused)] = why.get(str(refused), 0) + 1
            continue
        if record is not None:
            events.append(record)
    if why:
        latest = max((e["time"] for e in events), default=0.0)
        events.append({"event": SKIPPED, "time": latest, "source": source, "lines": sum(why.values()), "why": why})
    return events


METRICS_READ_LIMIT = 256 * MiB  # ~500,000 steps of events; a larger "metrics file" is not one


def read_events(path: str) -> list[dict]:
    """Every event in a metrics file, read through the bounded reader (a link, FIFO, device, huge or non-UTF-8 file
    is a one-line ReadRefused, never a hang or a traceback)."""
    return parse_events(read_text(path, METRICS_READ_LIMIT, "a metrics file"), os.path.basename(path))
