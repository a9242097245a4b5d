"""What run a run folder holds: a small record (engine, model, LoRA shape) written into it when `up` claims it, read
back bounded and without following links; an old folder without one judged by its checkpoint names (TRL's
checkpoint-N, verl's global_step_N). The decision (same run, another run refused, --fresh moves the old folder aside
whole, never deleting it) runs where the share is: in-process on a local folder, or in a throw-away container of the
main role's image (`python3 -m grpo_deploy.runtime.storage.run_record claim ...`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import time

from grpo_deploy.common.readback import ReadRefused, read_bytes

RECORD = "run-record.json"
RECORD_MAX_BYTES = 8192
VERSION = 1
ASIDE = ".before-"  # runs/<name>.before-<UTC time>: where --fresh moves an old run folder
PROBE = ".preflight-probe"  # preflight's shared-volume probe writes and removes it in the run folder
_MAX_ENTRIES = 10_000  # checkpoint folder entries looked at (a hostile folder of millions is not listed whole)
_TRL = re.compile(r"^checkpoint-(\d{1,18})$", re.ASCII)
_VERL = re.compile(r"^global_step_(\d{1,18})$", re.ASCII)
_VERL_TRACKER = "latest_checkpointed_iteration.txt"
ENGINE_OF_LAYOUT = {"trl": "trl-async", "verl": "verl"}
_FIX = ("give this run another run.name, or `grpo-deploy up --fresh` to move the folder aside (kept whole as "
        f"runs/<name>{ASIDE}<UTC time>)")


class RecordError(ValueError):
    """The run folder or its record cannot be read back safely: one line naming the file, what is wrong, the fix."""


def record_for(run: str, engine: str, model: str, lora_r: int, lora_alpha: int, target_modules) -> dict:
    """This run's record (what another run's `up` compares against)."""
    modules = target_modules if isinstance(target_modules, str) else sorted(str(m) for m in target_modules)
    return {"version": VERSION, "run": run, "engine": engine, "model": model,
            "lora": {"r": lora_r, "alpha": lora_alpha, "target_modules": modules}}


def _text(value, key: str, path: str, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value) > limit or not value.isprintable():
        raise RecordError(f"{path}: key {key} must be a printable string of 1 to {limit} characters; {_FIX}")
    return value


def _count(value, key: str, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise RecordError(f"{path}: key {key} must be a whole number from 1 to 1000000; {_FIX}")
    return value


def validate(data, path: str) -> dict:
    """The record in *data*, checked key by key (RecordError naming the key); unknown keys ignored (a newer kit)."""
    if not isinstance(data, dict):
        raise RecordError(f"{path}: is not a JSON object (the run record is one); {_FIX}")
    if data.get("version") != VERSION:
        raise RecordError(f"{path}: key version must be {VERSION} (written by another kit version?); {_FIX}")
    lora = data.get("lora")
    if not isinstance(lora, dict):
        raise RecordError(f"{path}: key lora must be an object with r, alpha and target_modules; {_FIX}")
    modules = lora.get("target_modules")
    if isinstance(modules, list):
        if len(modules) > 256:
            raise RecordError(f"{path}: key lora.target_modules lists more than 256 modules; {_FIX}")
        modules = sorted(_text(m, "lora.target_modules", path, 128) for m in modules)
    else:
        modules = _text(modules, "lora.target_modules", path, 128)
    return {"version": VERSION, "run": _text(data.get("run"), "run", path, 128),
            "engine": _text(data.get("engine"), "engine", path, 64),
            "model": _text(data.get("model"), "model", path, 512),
            "lora": {"r": _count(lora.get("r"), "lora.r", path), "alpha": _count(lora.get("alpha"), "lora.alpha", path),
                     "target_modules": modules}}


def _kind(path: str) -> str | None:
    """None when nothing is at *path*, else 'dir', 'link' or 'other' (never following a link)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return "dir" if stat.S_ISDIR(mode) else "link" if stat.S_ISLNK(mode) else "other"


def read_record(run_dir: str) -> dict | None:
    """The record in *run_dir*, validated; None when the folder holds none. RecordError (one line) for a folder that
    is a link or not a folder, and for a record that is a link, a FIFO, a device, huge, not UTF-8 or not JSON."""
    kind = _kind(run_dir)
    if kind is None:
        return None
    if kind != "dir":
        what = "a symbolic link" if kind == "link" else "not a folder"
        raise RecordError(f"{run_dir}: the run folder is {what}; the kit keeps a run in a real folder: remove it, "
                          "or give this run another run.name")
    path = os.path.join(run_dir, RECORD)
    try:
        raw = read_bytes(path, RECORD_MAX_BYTES, "the run record")
    except ReadRefused as exc:
        if exc.kind == "missing":
            return None
        what = str(exc).split("; ", 1)[0]  # the path and what is wrong; the fix is ours
        if exc.kind == "too-big":
            what = f"{path}: is more than {RECORD_MAX_BYTES} bytes"
        raise RecordError(f"{what} (the run record is a small regular JSON file); {_FIX}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RecordError(f"{path}: is not JSON (the run record is a small JSON object); {_FIX}") from None
    return validate(data, path)


def checkpoint_steps(checkpoint_dir: str | None) -> dict[str, list[int]]:
    """The steps named by checkpoint folders in *checkpoint_dir* (a real folder; a link is not listed), by layout
    (and 'tracker' when verl's tracker file is there)."""
    found: dict[str, list[int]] = {"trl": [], "verl": []}
    if not checkpoint_dir or _kind(checkpoint_dir) != "dir":
        return found
    try:
        with os.scandir(checkpoint_dir) as entries:
            for i, entry in enumerate(entries):
                if i >= _MAX_ENTRIES:
                    break
                for layout, pattern in (("trl", _TRL), ("verl", _VERL)):
                    m = pattern.match(entry.name)
                    if m:
                        found[layout].append(int(m.group(1)))
                if entry.name == _VERL_TRACKER:
                    found["tracker"] = []  # verl's, though no step folder is left
    except OSError:
        pass
    return found


def _holds_anything(run_dir: str) -> bool:
    """Whether *run_dir* is there with something in it (preflight's share probe, left or not, is nothing)."""
    if _kind(run_dir) is None:
        return False
    try:
        with os.scandir(run_dir) as entries:
            return any(entry.name != PROBE for entry in entries)
    except OSError:
        return True


def holder(run_dir: str, checkpoint_dir: str | None) -> dict | None:
    """What *run_dir* holds: None when there is no folder or an empty one; else the record (or, for an old folder
    without one, the engine its checkpoint names show: 'record': False, model None) with last_step, the newest
    checkpoint's step."""
    record = read_record(run_dir)
    if record is None and not _holds_anything(run_dir):
        return None
    steps = checkpoint_steps(checkpoint_dir)
    every = steps["trl"] + steps["verl"]
    last = max(every) if every else None  # the newest checkpoint's step
    if record is not None:
        return {**record, "record": True, "last_step": last}
    seen = {layout for layout in ("trl", "verl") if steps[layout]} | ({"verl"} if "tracker" in steps else set())
    engines = sorted(ENGINE_OF_LAYOUT[layout] for layout in seen)
    return {"record": False, "engine": "+".join(engines) or None, "model": None, "lora": None, "last_step": last}


def _shown(value) -> str:
    return str(value) if isinstance(value, str | int) else ",".join(value)


def differences(found: dict, mine: dict) -> list[str]:
    """How the run in a folder (*found*, from holder) differs from this run (*mine*, from record_for): engine, model,
    LoRA rank, alpha, target modules. A folder without a record is judged by its engine alone."""
    diff = []
    if found.get("engine") and found["engine"] != mine["engine"]:
        diff.append(f"engine {found['engine']}, not {mine['engine']}")
    if not found.get("record"):
        return diff
    if found["model"] != mine["model"]:
        diff.append(f"model {found['model']}, not {mine['model']}")
    for key in ("r", "alpha", "target_modules"):
        theirs, ours = found["lora"][key], mine["lora"][key]
        if theirs != ours:
            diff.append(f"lora.{key} {_shown(theirs)}, not {_shown(ours)}")
    return diff


def aside_path(run_dir: str, now: float | None = None) -> str:
    """Next to *run_dir*, on the same filesystem: <run_dir>.before-<UTC time>, a -2, -3 ... when taken."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    base = f"{run_dir.rstrip('/')}{ASIDE}{stamp}"
    candidate, n = base, 1
    while _kind(candidate) is not None:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def write_record(run_dir: str, record: dict) -> None:
    """*record* into *run_dir* (made when missing), atomically: a new file beside it, synced, renamed over."""
    os.makedirs(run_dir, exist_ok=True)
    if _kind(run_dir) != "dir":
        raise RecordError(f"{run_dir}: the run folder is not a real folder; remove it, or give this run another "
                          "run.name")
    path = os.path.join(run_dir, RECORD)
    tmp = f"{path}.{os.getpid()}.tmp"
    data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        if _kind(tmp) == "other":
            os.unlink(tmp)
        raise RecordError(f"{path}: cannot write the run record ({exc.strerror or exc}); check that the run's user "
                          "can write the run folder on the share") from None


def claim(run_dir: str, checkpoint_dir: str | None, mine: dict, fresh: bool = False, discard: bool = False) -> dict:
    """`up`'s decision on the run folder. fresh: the old folder moved aside whole (discard: removed, for the tuner's
    scratch trials), then a new record. Otherwise: refused ('ok': False, with what the folder holds and how it
    differs) when it holds another run; else the record written when missing. Never deletes without discard."""
    answer: dict = {"ok": True, "run_dir": run_dir, "moved_to": None, "removed": False, "note": None}
    if fresh and _kind(run_dir) is not None:
        if discard:
            if _kind(run_dir) == "dir":
                shutil.rmtree(run_dir)
            else:
                os.unlink(run_dir)
            answer["removed"] = True
        else:
            answer["moved_to"] = aside_path(run_dir)
            os.rename(run_dir, answer["moved_to"])
    found = holder(run_dir, checkpoint_dir)
    if found is not None:
        diff = differences(found, mine)
        if diff:
            return {**answer, "ok": False, "found": found, "differences": diff}
        if not found["record"]:
            answer["note"] = (f"{run_dir} holds no run record (an older kit's run"
                              f"{', ' + found['engine'] + ' checkpoints' if found['engine'] else ''}): "
                              "taken as this run's, recorded now")
        elif found == {**mine, "record": True, "last_step": found["last_step"]}:
            return answer
    write_record(run_dir, mine)
    return answer


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.storage.run_record",
                                     description="Claim RUN_DIR for the run in --record (JSON): refuse another run's "
                                                 "folder, or move it aside with --fresh.")
    parser.add_argument("action", choices=["claim", "show"])
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoints", default=None)
    parser.add_argument("--record", default=None, help="claim: this run's record, as JSON")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--discard", action="store_true", help="with --fresh: remove the old folder (scratch runs)")
    args = parser.parse_args(argv)
    umask = os.environ.get("GRPO_UMASK", "")
    if re.fullmatch(r"0?[0-7]{3}", umask):
        os.umask(int(umask, 8))
    try:
        if args.action == "show":
            print(json.dumps({"ok": True, "found": holder(args.run_dir, args.checkpoints)}))
            return 0
        mine = validate(json.loads(args.record or "null"), "--record")
        answer = claim(args.run_dir, args.checkpoints, mine, fresh=args.fresh, discard=args.discard)
    except (RecordError, OSError, ValueError) as exc:
        line = str(exc).replace("\n", " ") if isinstance(exc, RecordError) else f"{args.run_dir}: {exc}"
        print(f"{args.action}: {line}", file=sys.stderr)
        return 2
    print(json.dumps(answer))
    return 0 if answer["ok"] else 3


if __name__ == "__main__":
    raise SystemExit(_main())
