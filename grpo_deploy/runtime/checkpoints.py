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


def resolve_resume(output_dir: str, resume: str, expect: Shape | None = None) -> tuple[str | None, list[Quarantined]]:
    """The checkpoint to resume from (or None) and what was quarantined on the way.

    `never`: start fresh, touch nothing. `auto`: quarantine every incomplete checkpoint, then take the newest complete
    one. Anything else is a checkpoint path, which must be complete. With *expect* (this run's LoRA shape and world
    size), a checkpoint of another shape is refused with the difference, never silently loaded or skipped.
    """
    if resume == "never":
        return None, []
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


def _refuse_other_shape(path: str, expect: Shape | None) -> None:
    if expect is None:
        return
    found = shape_of(path, "trl")
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


@dataclass
class PruneResult:
    removed: list[Checkpoint]
    quarantined: list[Quarantined]
    kept: list[Checkpoint]


def prune(directory: str, keep: int, layout: str | None = None, dry_run: bool = False) -> PruneResult:
    """Keep the newest *keep* complete checkpoints. Older complete ones are removed only because newer complete ones
    exist (never the newest complete, never the one verl's tracker names); half-written ones are quarantined, not
    removed; pruned verl steps (data.pt only) are left alone."""
    if keep < 1:
        raise ValueError("keep must be at least 1: the newest complete checkpoint is never removed")
    layout = layout or detect_layout(directory)
    found = list_checkpoints(directory, layout)
    complete = [c for c in found if c.complete]
    tracker = verl_tracker(directory) if layout == "verl" else None
    doomed = [c for c in complete[:-keep] if c.step != tracker]
    half = [c for c in found if c.state == "half-written"]
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
    args = parser.parse_args(argv)
    layout = args.layout or detect_layout(args.directory)
    if args.action == "prune":
        if args.keep is None or args.keep < 1:
            parser.error("prune needs --keep N with N >= 1")
        r = prune(args.directory, args.keep, layout, dry_run=args.dry_run)
        print(json.dumps({"layout": layout, "dry_run": args.dry_run, "removed": [asdict(c) for c in r.removed],
                          "quarantined": [asdict(q) for q in r.quarantined], "kept": [asdict(c) for c in r.kept]}))
        return 0
    found = list_checkpoints(args.directory, layout)
    print(json.dumps({"layout": layout, "directory": args.directory, "tracker": verl_tracker(args.directory),
                      "checkpoints": [asdict(c) for c in found]}))
    return 1 if args.action == "verify" and any(c.state == "half-written" for c in found) else 0


if __name__ == "__main__":
    raise SystemExit(_main())
