"""`up`'s claim on its run folder on the share (grpo_deploy.runtime.storage.run_record decides): a folder that holds
another engine's run, or a run of another model or LoRA shape, refused in one line before anything starts; `--fresh`
moves the old folder aside whole. Read in-process when the share is a folder on this machine (before preflight:
nothing built, started or written), and claimed in a throw-away container of the main role's image on the host that
runs it, as the run's identity (where a remote share or a Docker volume is only seen), before the run starts."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.hosts import oneoff
from grpo_deploy.hosts.connect import Host
from grpo_deploy.runtime.storage import run_record
from grpo_deploy.spec.resolve import Resolved


def mine(res: Resolved) -> dict:
    """This run's record: its engine, model and LoRA shape."""
    lora = res.settings.lora
    return run_record.record_for(res.spec.run.name, res.engine, res.settings.model.path, lora.r, lora.alpha,
                                 lora.target_modules)


def _on_host(res: Resolved, path: str) -> str | None:
    """*path* (as the containers see it, under storage.mount) as this machine sees it, when the main role runs here
    with the share in a folder (hosts[].shared_dir); else None."""
    host = res.host_for(res.engine_info.main_role)
    mount = res.spec.storage.mount.rstrip("/")
    if host is None or host.address != "local" or not host.shared_dir or not path.startswith(mount + "/"):
        return None
    return host.shared_dir.rstrip("/") + path[len(mount):]


def refusal(res: Resolved, found: dict, diff: list[str], where: str) -> str:
    """The one line that refuses the folder: the other run's engine, model and last step, how it differs, the fix."""
    model = found.get("model") or "an unrecorded model"
    engine = found.get("engine") or "an unrecorded engine"
    step = f"last checkpoint step {found['last_step']}" if found.get("last_step") is not None else "no checkpoint"
    return (f"run folder {res.run_dir} on {where} holds another run ({engine} of {model}, {step}; "
            f"{'; '.join(diff)}): give this run another run.name, or `grpo-deploy up --fresh` to move that folder "
            f"aside (kept whole as {res.spec.run.name}{run_record.ASIDE}<UTC time>); nothing was started")


def refuse_other_run(res: Resolved) -> None:
    """Before anything: LaunchError when the run's folder, seen from this machine, holds another run. A share this
    machine does not see (a remote host, a Docker volume, a folder it may not read) is left to claim()."""
    run_dir = _on_host(res, res.run_dir)
    if run_dir is None:
        return
    record = os.path.join(run_dir, run_record.RECORD)
    if os.path.isdir(run_dir) and not os.path.islink(run_dir) and (
            not os.access(run_dir, os.R_OK | os.X_OK)
            or (os.path.isfile(record) and not os.path.islink(record) and not os.access(record, os.R_OK))):
        return  # the run's user owns it and this one may not read it: claim() reads it as that user
    try:
        found = run_record.holder(run_dir, _on_host(res, res.checkpoint_dir))
    except run_record.RecordError as exc:
        raise LaunchError(f"run folder {res.run_dir}: {exc}") from None
    diff = differences(res, found)
    if diff:
        raise LaunchError(refusal(res, found, diff, f"this machine ({run_dir})"))


def differences(res: Resolved, found: dict | None) -> list[str]:
    return run_record.differences(found, mine(res)) if found is not None else []


def where_words(res: Resolved) -> str:
    source, _ = oneoff.share_source(res, res.host_for(res.engine_info.main_role))
    return f"the share {source}" if source.startswith("/") else f"volume {source}"


def claim(conn: Host, res: Resolved, fresh: bool, log: Callable[[str], None], discard: bool = False) -> None:
    """The run's folder claimed on *conn* (the main role's host) in a throw-away container, before the run starts:
    LaunchError (one line) when it holds another run or cannot be read; with *fresh*, the old folder moved aside
    (removed with *discard*: the tuner's scratch trials) and where it went said in the progress line."""
    role = res.engine_info.main_role
    host, image = res.host_for(role), res.image_for(role)
    argv = ["python3", "-m", "grpo_deploy.runtime.storage.run_record", "claim", res.run_dir,
            "--checkpoints", res.checkpoint_dir, "--record", json.dumps(mine(res)),
            *(["--fresh"] if fresh else []), *(["--discard"] if fresh and discard else [])]
    r = oneoff.run(conn, image, argv, ident=res.identities[role], share=(res, host))
    where = f"{where_words(res)} ({host.name})"
    said = (r.err or "").strip().splitlines()
    if r.rc == 2 and said and said[-1].startswith("claim: "):
        raise LaunchError(f"run folder {said[-1].removeprefix('claim: ')}")
    refused = oneoff.engine_error(r)
    if refused is not None:
        raise LaunchError(f"{host.name}: the run folder's check cannot start: {refused} -> "
                          f"{oneoff.start_failure_fix(res, host.name, refused)}")
    if "No module named" in (r.err or ""):
        if fresh:
            raise LaunchError(f"image {image} on {host.name} holds an older grpo_deploy without the run record, so "
                              "--fresh cannot move the old folder aside: rebuild it (make images, or grpo-deploy up "
                              "refreshes it)")
        log(f"note: {res.run_dir} was not checked for another run: image {image} holds an older grpo_deploy")
        return
    try:
        answer = json.loads(r.out.strip().splitlines()[-1])
        ok = answer["ok"]
    except (ValueError, IndexError, KeyError, TypeError):
        raise LaunchError(f"checking the run folder {res.run_dir} on {host.name} failed: {r.line()}") from None
    if not ok:
        raise LaunchError(refusal(res, answer.get("found") or {}, answer.get("differences") or [], where))
    if answer.get("moved_to"):
        log(f"--fresh: moved {res.run_dir} aside to {answer['moved_to']} on {where}")
    elif answer.get("removed"):
        log(f"--fresh: removed the trial folder {res.run_dir} on {where} (a tuner trial's scratch)")
    if answer.get("note"):
        log(f"note: {answer['note']}")
