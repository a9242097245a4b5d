"""Checkpoints of both engines on the shared storage: list (sizes, completeness, LoRA shape, world size), verify,
quarantine half-written ones (never delete them), prune to the retention count only behind a newer complete one. The
resume choice built on them is resume.py's.

Layouts: TRL writes `checkpoint-N/` and its `trainer_state.json` last. verl writes `global_step_N/` (with `data.pt`
and `actor/` shards per rank) and then `latest_checkpointed_iteration.txt`, the tracker, last; a step newer than the
tracker is half-written. Runs inside the images too: `python3 -m grpo_deploy.runtime.storage.checkpoints list DIR`.

Nothing is read or moved through a link: a checkpoint that is a symbolic link is listed as such and never removed,
moved or followed; a `quarantine` that is not a real folder stops every move; state files are read through the one
bounded reader (common.readback). A prune or resume holds the folder's lock (common.dirlock) and checks every
checkpoint it would touch before the first one moves; each is then renamed away in one step (all or nothing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import time
from dataclasses import dataclass

from grpo_deploy.common.dirlock import Busy, locked
from grpo_deploy.common.readback import MiB, ReadRefused, read_bytes

# Step and rank numbers are bounded (18 and 9 digits): a folder named with a longer number is not a checkpoint.
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d{1,18})$", re.ASCII)
VERL_PATTERN = re.compile(r"^global_step_(\d{1,18})$", re.ASCII)
VERL_TRACKER = "latest_checkpointed_iteration.txt"
VERL_SHARD = re.compile(r"^(model|optim|extra_state)_world_size_(\d{1,9})_rank_(\d{1,9})\.pt$", re.ASCII)
STATE_FILE = "trainer_state.json"  # transformers writes it last, so its presence marks a finished checkpoint
QUARANTINE_DIR = "quarantine"
STATE_LIMIT = 64 * MiB  # trainer_state.json grows with the log history: a few MB for a long run
META_LIMIT = MiB  # adapter_config.json, lora_train_meta.json, fsdp_config.json, the tracker


def is_real_dir(path: str) -> bool:
    """A real directory, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _load_json(path: str, limit: int) -> object:
    """A JSON file through the bounded no-follow reader; ValueError (ReadRefused is one) when it cannot be read."""
    raw = read_bytes(path, limit, os.path.basename(path))
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply to be a state file") from None


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
        if match and (is_real_dir(path) or is_link(path)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def incomplete_reason(path: str) -> str | None:
    """Why a checkpoint cannot be resumed from, or None when it is complete."""
    if is_link(path):
        return LINK_REASON
    state = os.path.join(path, STATE_FILE)
    try:
        _load_json(state, STATE_LIMIT)
    except ReadRefused as error:
        if error.kind == "missing":
            return f"no {STATE_FILE} (half-written)"
        return f"unreadable {STATE_FILE}: {str(error).split(': ', 1)[-1]}"
    except ValueError:
        return f"unreadable {STATE_FILE}: not JSON"
    return sharded_incomplete(path)


FSDP_MODEL_DIR, FSDP_OPTIMIZER_DIR = "pytorch_model_fsdp_0", "optimizer_0"  # a trainer of several processes (FSDP2)
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint writes it once every rank's shard is written
DCP_SHARD = re.compile(r"^__(\d{1,9})_\d+\.distcp$", re.ASCII)
RNG_STATE = re.compile(r"^rng_state(_\d+)?\.pth$", re.ASCII)


def sharded_incomplete(path: str) -> str | None:
    """Why a sharded (FSDP2) TRL checkpoint is not whole, or None (also for a checkpoint of one process): both shard
    folders with their metadata, one model shard and one RNG state per rank (the ranks write their RNG state after
    rank 0 may have written trainer_state.json)."""
    model_dir = os.path.join(path, FSDP_MODEL_DIR)
    if not os.path.lexists(model_dir):
        return None
    for folder in (FSDP_MODEL_DIR, FSDP_OPTIMIZER_DIR):
        if not is_real_dir(os.path.join(path, folder)):
            return f"no {folder}/ folder (half-written sharded checkpoint)"
        if not os.path.isfile(os.path.join(path, folder, DCP_METADATA)) or \
                is_link(os.path.join(path, folder, DCP_METADATA)):
            return f"no {folder}/{DCP_METADATA} (half-written sharded checkpoint)"
    ranks = {int(m.group(1)) for n in _listdir(model_dir) if (m := DCP_SHARD.match(n))}
    rng = sum(1 for n in _listdir(path) if RNG_STATE.match(n))
    if not ranks or ranks != set(range(len(ranks))):
        return f"{FSDP_MODEL_DIR}/ holds shards of ranks {sorted(ranks)}, not 0..n-1 (half-written sharded checkpoint)"
    if rng != len(ranks):
        return f"{rng} RNG state file(s) for {len(ranks)} ranks (half-written sharded checkpoint)"
    return None


LINK_REASON = "a symbolic link: the manager never follows a link out of the run folder (replace it with the folder)"


class TrackerUnreadable(ValueError):
    """verl's tracker is missing or unreadable while global_step_N directories exist: complete cannot be told from
    half-written, so nothing is moved or removed."""


class CheckpointRefused(TrackerUnreadable):
    """A prune or resume would move or remove something it must not (through a link, out of the run folder), or
    another process holds the folder's lock: nothing was moved or removed. A TrackerUnreadable, so that callers that
    skip retention when nothing can be touched skip it here too."""


def quarantine_dir(output_dir: str) -> str:
    """<output_dir>/quarantine when it is a real folder or absent; refused when it is a link or a file."""
    target_dir = os.path.join(output_dir, QUARANTINE_DIR)
    if os.path.lexists(target_dir) and not is_real_dir(target_dir):
        raise CheckpointRefused(f"{target_dir} is a symbolic link or a file, not a folder: a quarantine would move "
                                "checkpoints out of the run folder, so nothing was moved or removed; remove it "
                                "(a folder of that name is created)")
    return target_dir


def quarantine(path: str, output_dir: str) -> str:
    """Move a checkpoint to `<output_dir>/quarantine/` in one rename, never overwriting an earlier quarantined one and
    never through a link (the quarantine folder and the checkpoint must both be real folders)."""
    target_dir = quarantine_dir(output_dir)
    if not is_real_dir(path):
        raise CheckpointRefused(f"{path}: {LINK_REASON}; nothing was moved")
    try:
        os.mkdir(target_dir)
    except FileExistsError:
        pass
    if not is_real_dir(target_dir):
        raise CheckpointRefused(f"{target_dir} changed while quarantining (now not a folder); nothing was moved")
    target = os.path.join(target_dir, os.path.basename(path))
    if os.path.lexists(target):
        target = f"{target}.{time.strftime('%Y%m%d-%H%M%S')}.{os.getpid()}"
    os.rename(path, target)  # same folder tree, same filesystem: all or nothing
    return target


def folder_lock(directory: str):
    """The checkpoint folder's lock, Busy turned into CheckpointRefused."""
    from contextlib import contextmanager

    @contextmanager
    def held():
        try:
            with locked(directory, "its checkpoints (a prune or resume)"):
                yield
        except Busy as exc:
            raise CheckpointRefused(str(exc)) from None

    return held()


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
        data = _load_json(path, META_LIMIT)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


COUNT_LIMIT = 1 << 20  # a LoRA rank or a world size above it is not one (a world is counted rank by rank)


def _count(value: object) -> int | None:
    """*value* when it is a whole number from 1 to COUNT_LIMIT (a file's word for a rank or a world size), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= COUNT_LIMIT else None


def shape_of(path: str, layout: str) -> Shape:
    """The LoRA shape and world size a checkpoint was written with (None where the files do not say)."""
    if layout == "trl":
        adapter = _json(os.path.join(path, "adapter_config.json"))
        modules = adapter.get("target_modules")
        model_dir = os.path.join(path, FSDP_MODEL_DIR)
        shards = {m.group(1) for n in (_listdir(model_dir) if is_real_dir(model_dir) else [])
                  if (m := DCP_SHARD.match(n))}
        ranks = shards or [n for n in _listdir(path) if RNG_STATE.match(n)]  # a sharded one: its model shards say
        return Shape(_count(adapter.get("r")),
                     tuple(sorted(modules)) if isinstance(modules, list) else None, len(ranks) or None)
    actor = os.path.join(path, "actor")
    meta = _json(os.path.join(actor, "lora_train_meta.json"))
    world = _json(os.path.join(actor, "fsdp_config.json")).get("world_size")
    return Shape(_count(meta.get("r")), None, _count(world))


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
        text = read_bytes(os.path.join(directory, VERL_TRACKER), 64, VERL_TRACKER).decode("ascii").strip()
    except (ReadRefused, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and text.isascii() and len(text) <= 18 else None


def verl_incomplete(path: str, step: int, tracker: int | None) -> tuple[str, str]:
    """(state, reason) of one global_step_N."""
    if is_link(path):
        return "link", LINK_REASON
    actor = os.path.join(path, "actor")
    if tracker is None or step > tracker:
        return "half-written", (f"newer than the tracker ({VERL_TRACKER} says {tracker})" if tracker is not None
                                else f"no readable {VERL_TRACKER}: verl writes it after every complete save")
    if not is_real_dir(actor):
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
    if not stat.S_ISREG(_lstat_mode(os.path.join(path, "data.pt"))):
        return "half-written", "no data.pt (dataloader state)"
    return "complete", ""


def _lstat_mode(path: str) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def list_checkpoints(directory: str, layout: str | None = None) -> list[Checkpoint]:
    """Every checkpoint in *directory*, oldest first, with its size, state and shape."""
    layout = layout or detect_layout(directory)
    out = []
    if layout == "trl":
        for step, path in checkpoints(directory):
            reason = incomplete_reason(path)
            state = "link" if reason == LINK_REASON else "half-written" if reason else "complete"
            out.append(_entry(step, path, state, reason or "", layout))
        return out
    tracker = verl_tracker(directory)
    for name in _listdir(directory):
        match = VERL_PATTERN.match(name)
        path = os.path.join(directory, name)
        if match and (is_real_dir(path) or is_link(path)):
            step = int(match.group(1))
            state, reason = verl_incomplete(path, step, tracker)
            out.append(_entry(step, path, state, reason, layout))
    return sorted(out, key=lambda c: c.step)


def _entry(step: int, path: str, state: str, reason: str, layout: str) -> Checkpoint:
    if state == "link":
        return Checkpoint(step, path, 0, state, reason)
    shape = shape_of(path, layout)
    return Checkpoint(step, path, _size(path), state, reason, shape.lora_r,
                      list(shape.target_modules) if shape.target_modules else None, shape.world_size)


def require_tracker(directory: str, found: list[Checkpoint]) -> int | None:
    tracker = verl_tracker(directory)
    if tracker is None and found:
        raise TrackerUnreadable(
            f"{os.path.join(directory, VERL_TRACKER)} is missing or unreadable (verl writes it after each complete "
            f"save; an interrupted write leaves it empty) while {len(found)} global_step_N exist: complete cannot be "
            f"told from half-written, so nothing was moved or removed. Check `checkpoints list`, then write the step "
            f"of the newest complete one into it")
    return tracker


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
    if not is_real_dir(directory):
        return PruneResult([], [], [])
    with folder_lock(directory):
        found = list_checkpoints(directory, layout)
        complete = [c for c in found if c.complete]
        tracker = require_tracker(directory, found) if layout == "verl" else None
        doomed = [c for c in complete[:-keep] if c.step != tracker]
        half = [] if leave_partial else [c for c in found if c.state == "half-written"]
        kept = [c for c in complete if c not in doomed]
        if dry_run:
            return PruneResult(doomed, [Quarantined(c.path, "", c.reason) for c in half], kept)
        if half:
            quarantine_dir(directory)  # every refusal before the first move
        moved = [Quarantined(c.path, quarantine(c.path, directory), c.reason) for c in half]
        for c in doomed:
            _remove(c.path)
    return PruneResult(doomed, moved, kept)


def _remove(path: str) -> None:
    """Remove a complete checkpoint all or nothing: renamed in one step to a hidden name beside it (no longer a
    checkpoint of any listing), then deleted; never through a link."""
    if not is_real_dir(path):
        raise CheckpointRefused(f"{path} changed while pruning (now not a folder); it was not removed")
    parent, name = os.path.split(path)
    doomed = os.path.join(parent, f".pruning-{name}.{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed)


def _main(argv: list[str] | None = None) -> int:
    import argparse
    from dataclasses import asdict

    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.storage.checkpoints",
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
        except TrackerUnreadable as error:  # CheckpointRefused too: nothing was moved or removed
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
