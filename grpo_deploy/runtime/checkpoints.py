"""Checkpoints of both engines on the shared storage: list (sizes, completeness, LoRA shape, world size), verify,
quarantine half-written ones (never delete them), prune to the retention count only behind a newer complete one, and
resume selection (newest complete; refused when the world size or the LoRA shape changed).

Layouts: TRL writes `checkpoint-N/` and its `trainer_state.json` last. verl writes `global_step_N/` (with `data.pt`
and `actor/` shards per rank) and then `latest_checkpointed_iteration.txt`, the tracker, last; a step newer than the
tracker is half-written. Runs inside the images too: `python3 -m grpo_deploy.runtime.checkpoints list DIR`."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
VERL_PATTERN = re.compile(r"^global_step_(\d+)$")
VERL_TRACKER = "latest_checkpointed_iteration.txt"
VERL_SHARD = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")
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
        reason = incomplete_reason(resume) if os.path.isdir(resume) else "no such directory"
        if reason:
            raise ResumeError(f"resume: {resume} cannot be resumed from: {reason}")
        _refuse_other_shape(resume, expect)
        return resume, []
    moved, complete = [], []
    for _step, path in checkpoints(output_dir):
        reason = incomplete_reason(path)
        if reason:
            moved.append(Quarantined(path, quarantine(path, output_dir), reason))
        else:
            complete.append(path)
    if complete:
        _refuse_other_shape(complete[-1], expect)
    return (complete[-1] if complete else None), moved


# ------------------------------------------------------------------ the manager (both layouts)


@dataclass(frozen=True)
class Shape:
    """What a checkpoint must match to be resumed: LoRA rank and target modules, and the number of processes."""

    lora_r: int | None = None
    target_modules: tuple[str, ...] | None = None
    world_size: int | None = None

    def differences(self, other: Shape) -> list[str]:
        out = []
        for name in ("lora_r", "target_modules", "world_size"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine != theirs:
                out.append(f"{name} {theirs} in the checkpoint, {mine} in this run")
        return out


def _refuse_other_shape(path: str, expect: Shape | None, layout: str = "trl") -> None:
    if expect is None:
        return
    found = shape_of(path, layout)
    diff = expect.differences(found)
    if diff:
        raise ResumeError(f"resume: {path} was written by a run of another shape ({'; '.join(diff)}): resuming would "
                          "load mismatched weights or optimizer state. Start a new run (another run.name or "
                          "--fresh), or set the spec back to the checkpoint's shape")


@dataclass
class Checkpoint:
    step: int
    path: str
    size_bytes: int
    state: str  # complete | half-written | pruned
    reason: str = ""
    lora_r: int | None = None
    target_modules: list[str] | None = None
    world_size: int | None = None

    @property
    def complete(self) -> bool:
        return self.state == "complete"


def _size(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def shape_of(path: str, layout: str) -> Shape:
    """The LoRA shape and world size a checkpoint was written with (None where the files do not say)."""
    if layout == "trl":
        adapter = _json(os.path.join(path, "adapter_config.json"))
        modules = adapter.get("target_modules")
        ranks = [n for n in _listdir(path) if re.fullmatch(r"rng_state(_\d+)?\.pth", n)]
        return Shape(adapter.get("r") if isinstance(adapter.get("r"), int) else None,
                     tuple(sorted(modules)) if isinstance(modules, list) else None, len(ranks) or None)
    actor = os.path.join(path, "actor")
    meta = _json(os.path.join(actor, "lora_train_meta.json"))
    world = _json(os.path.join(actor, "fsdp_config.json")).get("world_size")
    return Shape(meta.get("r") if isinstance(meta.get("r"), int) else None, None,
                 world if isinstance(world, int) else None)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def detect_layout(directory: str) -> str:
    """trl or verl, from what the directory holds (trl when empty)."""
    names = _listdir(directory)
    return "verl" if VERL_TRACKER in names or any(VERL_PATTERN.match(n) for n in names) else "trl"


def verl_tracker(directory: str) -> int | None:
    """The step verl last finished saving (its tracker), or None when absent or unreadable."""
    try:
        with open(os.path.join(directory, VERL_TRACKER), encoding="utf-8") as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _verl_incomplete(path: str, step: int, tracker: int | None) -> tuple[str, str]:
    """(state, reason) of one global_step_N."""
    actor = os.path.join(path, "actor")
    if tracker is None or step > tracker:
        return "half-written", (f"newer than the tracker ({VERL_TRACKER} says {tracker})" if tracker is not None
                                else f"no readable {VERL_TRACKER}: verl writes it after every complete save")
    if not os.path.isdir(actor):
        return "pruned", "actor/ removed by retention (data.pt only)"
    world = shape_of(path, "verl").world_size
    if world is None:
        return "half-written", "actor/fsdp_config.json missing or unreadable"
    shards = {(m.group(1), int(m.group(3))) for n in _listdir(actor) if (m := VERL_SHARD.match(n))
              and int(m.group(2)) == world}
    missing = [f"{kind} rank {r}" for kind in ("model", "optim", "extra_state") for r in range(world)
               if (kind, r) not in shards]
    if missing:
        return "half-written", f"missing shards: {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"
    if not os.path.isfile(os.path.join(path, "data.pt")):
        return "half-written", "no data.pt (dataloader state)"
    return "complete", ""


def list_checkpoints(directory: str, layout: str | None = None) -> list[Checkpoint]:
    """Every checkpoint in *directory*, oldest first, with its size, state and shape."""
    layout = layout or detect_layout(directory)
    out = []
    if layout == "trl":
        for step, path in checkpoints(directory):
            reason = incomplete_reason(path)
            out.append(_entry(step, path, "half-written" if reason else "complete", reason or "", layout))
        return out
    tracker = verl_tracker(directory)
    for name in _listdir(directory):
        match = VERL_PATTERN.match(name)
        path = os.path.join(directory, name)
        if match and os.path.isdir(path):
            step = int(match.group(1))
            state, reason = _verl_incomplete(path, step, tracker)
            out.append(_entry(step, path, state, reason, layout))
    return sorted(out, key=lambda c: c.step)


def _entry(step: int, path: str, state: str, reason: str, layout: str) -> Checkpoint:
    shape = shape_of(path, layout)
    return Checkpoint(step, path, _size(path), state, reason, shape.lora_r,
                      list(shape.target_modules) if shape.target_modules else None, shape.world_size)


class TrackerUnreadable(ValueError):
    """verl's tracker is missing or unreadable while global_step_N directories exist: complete cannot be told from
    half-written, so nothing is moved or removed."""


def _require_tracker(directory: str, found: list[Checkpoint]) -> int | None:
    tracker = verl_tracker(directory)
    if tracker is None and found:
        raise TrackerUnreadable(
            f"{os.path.join(directory, VERL_TRACKER)} is missing or unreadable (verl writes it after each complete "
            f"save; an interrupted write leaves it empty) while {len(found)} global_step_N exist: complete cannot be "
            f"told from half-written, so nothing was moved or removed. Check `checkpoints list`, then write the step "
            f"of the newest complete one into it")
    return tracker


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
        state, reason = (_verl_incomplete(resume, int(match.group(1)), verl_tracker(parent))
                         if match and os.path.isdir(resume) else ("missing", "no such global_step_N directory"))
        if state != "complete":
            raise ResumeError(f"resume: {resume} cannot be resumed from: {reason or state}")
        _refuse_other_shape(resume, expect, "verl")
        return resume, []
    if not found and verl_tracker(directory) is None:
        return None, []
    tracker = _require_tracker(directory, found)
    named = next((c for c in found if c.step == tracker), None)
    if named is None or not named.complete:
        why = "does not exist" if named is None else f"is {named.state}: {named.reason}"
        raise ResumeError(f"resume: {VERL_TRACKER} in {directory} names step {tracker}, whose checkpoint {why}; "
                          "verl would start from scratch or fail while loading. Fix the tracker (the newest complete "
                          "step, `checkpoints list`), or start a new run")
    _refuse_other_shape(named.path, expect, "verl")
    moved = [Quarantined(c.path, quarantine(c.path, directory), c.reason) for c in found if c.step > tracker]
    return named.path, moved


@dataclass
class PruneResult:
    removed: list[Checkpoint]
    quarantined: list[Quarantined]
    kept: list[Checkpoint]


def prune(directory: str, keep: int, layout: str | None = None, dry_run: bool = False,
          leave_partial: bool = False) -> PruneResult:
    """Keep the newest *keep* complete checkpoints. Older complete ones are removed only because newer complete ones
    exist (never the newest complete, never the one verl's tracker names); half-written ones are quarantined, not
    removed (*leave_partial*: left where they are — for a prune while the trainer may be saving); pruned verl steps
    (data.pt only) are left alone. Everything on disk counts, whichever process wrote it: verl's own retention only
    knows the saves of the process that made them, so after a resume the older ones are this prune's to enforce.
    verl without a readable tracker: TrackerUnreadable, nothing touched."""
    if keep < 1:
        raise ValueError("keep must be at least 1: the newest complete checkpoint is never removed")
    layout = layout or detect_layout(directory)
    found = list_checkpoints(directory, layout)
    complete = [c for c in found if c.complete]
    tracker = _require_tracker(directory, found) if layout == "verl" else None
    doomed = [c for c in complete[:-keep] if c.step != tracker]
    half = [] if leave_partial else [c for c in found if c.state == "half-written"]
    if dry_run:
        return PruneResult(doomed, [Quarantined(c.path, "", c.reason) for c in half],
                           [c for c in complete if c not in doomed])
    moved = [Quarantined(c.path, quarantine(c.path, directory), c.reason) for c in half]
    for c in doomed:
        shutil.rmtree(c.path)
    return PruneResult(doomed, moved, [c for c in complete if c not in doomed])


def _main(argv: list[str] | None = None) -> int:
    import argparse
    from dataclasses import asdict

    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.checkpoints",
                                     description="List, verify or prune the checkpoints in DIR (TRL or verl layout).")
    parser.add_argument("action", choices=["list", "verify", "prune"])
    parser.add_argument("directory")
    parser.add_argument("--layout", choices=["trl", "verl"])
    parser.add_argument("--keep", type=int, default=None, help="prune: complete checkpoints to keep (>= 1)")
    parser.add_argument("--dry-run", action="store_true", help="prune: say what would go, change nothing")
    parser.add_argument("--leave-partial", action="store_true",
                        help="prune: leave half-written checkpoints where they are (a save may be in progress)")
    args = parser.parse_args(argv)
    layout = args.layout or detect_layout(args.directory)
    if args.action == "prune":
        if args.keep is None or args.keep < 1:
            parser.error("prune needs --keep N with N >= 1")
        try:
            r = prune(args.directory, args.keep, layout, dry_run=args.dry_run, leave_partial=args.leave_partial)
        except TrackerUnreadable as error:
            print(f"prune: {error}", file=sys.stderr)
            return 2
        print(json.dumps({"layout": layout, "dry_run": args.dry_run, "removed": [asdict(c) for c in r.removed],
                          "quarantined": [asdict(q) for q in r.quarantined], "kept": [asdict(c) for c in r.kept]}))
        return 0
    found = list_checkpoints(args.directory, layout)
    print(json.dumps({"layout": layout, "directory": args.directory, "tracker": verl_tracker(args.directory),
                      "checkpoints": [asdict(c) for c in found]}))
    return 1 if args.action == "verify" and any(c.state == "half-written" for c in found) else 0


if __name__ == "__main__":
    raise SystemExit(_main())
