"""Resume selection over trainer checkpoints: newest complete `checkpoint-N`, half-written ones moved to quarantine/."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"  # transformers writes it last, so its presence marks a finished checkpoint
QUARANTINE_DIR = "quarantine"


class ResumeError(ValueError):
    """The configured resume target cannot be used."""


@dataclass(frozen=True)
class Quarantined:
    path: str
    moved_to: str
    reason: str


def checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """`(step, path)` of every `checkpoint-N` directory in `output_dir`, oldest first."""
    try:
        names = os.listdir(output_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = CHECKPOINT_PATTERN.match(name)
        path = os.path.join(output_dir, name)
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def incomplete_reason(path: str) -> str | None:
    """Why a checkpoint cannot be resumed from, or None when it is complete."""
    state = os.path.join(path, STATE_FILE)
    if not os.path.isfile(state):
        return f"no {STATE_FILE} (half-written)"
    try:
        with open(state, encoding="utf-8") as handle:
            json.load(handle)
    except (OSError, ValueError) as error:
        return f"unreadable {STATE_FILE}: {error}"
    return None


def quarantine(path: str, output_dir: str) -> str:
    """Move a checkpoint to `<output_dir>/quarantine/`, never overwriting an earlier quarantined one."""
    target_dir = os.path.join(output_dir, QUARANTINE_DIR)
    os.makedirs(target_dir, exist_ok=True)
    target = os.path.join(target_dir, os.path.basename(path))
    if os.path.exists(target):
        target = f"{target}.{time.strftime('%Y%m%d-%H%M%S')}.{os.getpid()}"
    shutil.move(path, target)
    return target


def resolve_resume(output_dir: str, resume: str) -> tuple[str | None, list[Quarantined]]:
    """The checkpoint to resume from (or None) and what was quarantined on the way.

    `never`: start fresh, touch nothing. `auto`: quarantine every incomplete checkpoint, then take the newest complete
    one. Anything else is a checkpoint path, which must be complete.
    """
    if resume == "never":
        return None, []
    if resume != "auto":
        reason = incomplete_reason(resume) if os.path.isdir(resume) else "no such directory"
        if reason:
            raise ResumeError(f"resume: {resume} cannot be resumed from: {reason}")
        return resume, []
    moved, complete = [], []
    for _step, path in checkpoints(output_dir):
        reason = incomplete_reason(path)
        if reason:
            moved.append(Quarantined(path, quarantine(path, output_dir), reason))
        else:
            complete.append(path)
    return (complete[-1] if complete else None), moved
