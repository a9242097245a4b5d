"""The resume choice for both engines: which checkpoint a restarted run loads (newest complete, TRL's or what verl's
tracker names), the half-written ones quarantined on the way, and a checkpoint of another LoRA shape or world size
refused with the difference. Built on checkpoints.py's listing, quarantine and folder lock."""

from __future__ import annotations

import os

from grpo_deploy.runtime.storage.checkpoints import (
    LINK_REASON,
    VERL_PATTERN,
    VERL_TRACKER,
    Quarantined,
    Shape,
    checkpoints,
    folder_lock,
    incomplete_reason,
    is_link,
    is_real_dir,
    list_checkpoints,
    quarantine,
    quarantine_dir,
    require_tracker,
    shape_of,
    verl_incomplete,
    verl_tracker,
)


class ResumeError(ValueError):
    """The configured resume target cannot be used."""


def resolve_resume(output_dir: str, resume: str, expect: Shape | None = None,
                   layout: str = "trl") -> tuple[str | None, list[Quarantined]]:
    """The checkpoint to resume from (or None) and what was quarantined on the way.

    `never`: start fresh, touch nothing. `auto`: quarantine every incomplete checkpoint, then take the newest complete
    one. Anything else is a checkpoint path, which must be complete. With *expect* (this run's LoRA shape and world
    size), a checkpoint of another shape is refused with the difference, never silently loaded or skipped. verl
    (*layout* "verl") resumes from what its tracker names: see verl_resume.
    """
    if resume == "never":
        return None, []
    if layout == "verl":
        return verl_resume(output_dir, resume, expect)
    if resume != "auto":
        reason = incomplete_reason(resume) if (is_real_dir(resume) or is_link(resume)) else "no such directory"
        if reason:
            raise ResumeError(f"resume: {resume} cannot be resumed from: {reason}")
        _refuse_other_shape(resume, expect)
        return resume, []
    if not is_real_dir(output_dir):
        return None, []
    with folder_lock(output_dir):
        half, complete = [], []
        for _step, path in checkpoints(output_dir):
            reason = incomplete_reason(path)
            if reason == LINK_REASON:
                continue  # never resumed from, never moved
            (half if reason else complete).append((path, reason))
        if half:
            quarantine_dir(output_dir)  # refused before the first move
        if complete:
            _refuse_other_shape(complete[-1][0], expect)
        moved = [Quarantined(path, quarantine(path, output_dir), reason) for path, reason in half]
    return (complete[-1][0] if complete else None), moved


def _refuse_other_shape(path: str, expect: Shape | None, layout: str = "trl") -> None:
    if expect is None:
        return
    found = shape_of(path, layout)
    diff = expect.differences(found)
    if diff:
        raise ResumeError(f"resume: {path} was written by a run of another shape ({'; '.join(diff)}): resuming would "
                          "load mismatched weights or optimizer state. Start a new run (another run.name or "
                          "--fresh), or set the spec back to the checkpoint's shape")


def verl_resume(directory: str, resume: str = "auto", expect: Shape | None = None) -> tuple[str | None,
                                                                                                list[Quarantined]]:
    """What a verl restart with `trainer.resume_mode=auto` loads, made safe before it starts: the step its tracker
    names, which must be complete (verl itself starts from scratch without a word when the tracker or the directory
    is missing, and never checks the shards); steps newer than the tracker (a save cut short) are quarantined, so that
    verl does not write the same step into a directory still holding the dead save's files. An explicit `resume`
    path must be a complete global_step_N. A checkpoint of another LoRA rank or world size is refused."""
    found = list_checkpoints(directory, "verl")
    if resume != "auto":
        match = VERL_PATTERN.match(os.path.basename(os.path.normpath(resume)))
        parent = os.path.dirname(os.path.normpath(resume))
        state, reason = (verl_incomplete(resume, int(match.group(1)), verl_tracker(parent))
                         if match and (is_real_dir(resume) or is_link(resume))
                         else ("missing", "no such global_step_N directory"))
        if state != "complete":
            raise ResumeError(f"resume: {resume} cannot be resumed from: {reason or state}")
        _refuse_other_shape(resume, expect, "verl")
        return resume, []
    if not found and verl_tracker(directory) is None:
        return None, []
    tracker = require_tracker(directory, found)
    named = next((c for c in found if c.step == tracker), None)
    if named is None or not named.complete:
        why = "does not exist" if named is None else f"is {named.state}: {named.reason}"
        raise ResumeError(f"resume: {VERL_TRACKER} in {directory} names step {tracker}, whose checkpoint {why}; "
                          "verl would start from scratch or fail while loading. Fix the tracker (the newest complete "
                          "step, `checkpoints list`), or start a new run")
    _refuse_other_shape(named.path, expect, "verl")
    newer = [c for c in found if c.step > tracker and c.state != "link"]
    if not newer:
        return named.path, []
    with folder_lock(directory):
        quarantine_dir(directory)  # refused before the first move
        moved = [Quarantined(c.path, quarantine(c.path, directory), c.reason) for c in newer]
    return named.path, moved
