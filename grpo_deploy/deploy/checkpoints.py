"""`grpo-deploy checkpoints`: the run's checkpoints listed, verified or pruned where they are written — the runtime's
checkpoint manager (grpo_deploy.runtime.storage.checkpoints) run in a throw-away container of the main role's image,
on the host that holds them, as the run's identity, with the shared storage mounted and no network."""

from __future__ import annotations

import json
from typing import Any

from grpo_deploy import preflight
from grpo_deploy.common.shown import printable
from grpo_deploy.common.table import human_bytes, table
from grpo_deploy.hosts import oneoff
from grpo_deploy.spec.resolve import Resolved


class CheckpointsError(RuntimeError):
    """The checkpoints could not be read (host, image or storage)."""


def run_manager(res: Resolved, ctx: preflight.Context, action: str, keep: int | None = None,
                dry_run: bool = False) -> dict[str, Any]:
    """The manager's JSON answer for *action* (list, verify, prune) on the run's checkpoint directory."""
    role = res.engine_info.main_role
    host, image = res.host_for(role), res.image_for(role)
    layout = res.engine_info.checkpoint_layout
    argv = ["python3", "-m", "grpo_deploy.runtime.storage.checkpoints", action, res.checkpoint_dir, "--layout", layout]
    if action == "prune":
        argv += ["--keep", str(keep), *(["--dry-run"] if dry_run else [])]
    present = preflight.image_on(ctx, host, image)
    if present is False:
        raise CheckpointsError(f"{host.name}: image {image} is not there (the checkpoint manager runs in the {role}'s "
                               "image) -> grpo-deploy up builds or ships it")
    if present is not True:
        raise CheckpointsError(f"{host.name}: {present} -> grpo-deploy preflight says why")
    r = oneoff.run(ctx.connector(host), image, argv, ident=res.identities[role], share=(res, host))
    try:
        answer = json.loads(r.out.strip().splitlines()[-1]) if r.out.strip() else None
    except ValueError:
        answer = None
    said = (r.err or "").strip().splitlines()
    if answer is None and r.rc == 2 and said and said[-1].startswith(f"{action}: "):  # the manager refused: why
        raise CheckpointsError(f"{host.name}: {said[-1]}")
    if answer is None and r.ok:
        raise CheckpointsError(f"image {image} on {host.name} holds an older grpo_deploy without the checkpoint "
                               "manager: rebuild it (make images, or grpo-deploy up refreshes it)")
    refused = oneoff.engine_error(r)
    if refused is not None:
        raise CheckpointsError(f"{host.name}: the checkpoint manager's container cannot start: {refused} -> "
                               f"{oneoff.start_failure_fix(res, host.name, refused)}")
    if answer is None:
        raise CheckpointsError(f"reading the checkpoints on {host.name} failed: {r.line()} (is image {image} on the "
                               "host? grpo-deploy preflight says)")
    answer["host"], answer["exit_code"] = host.name, r.rc
    return answer


def listing_text(answer: dict[str, Any]) -> str:
    """The listing `checkpoints` prints; the checkpoint folder's names and metadata printed through printable."""
    rows = [[str(c["step"]), c["state"], human_bytes(c["size_bytes"]), str(c["lora_r"] or "-"),
             str(c["world_size"] or "-"), c["reason"] or ""] for c in answer["checkpoints"]]
    total = sum(c["size_bytes"] for c in answer["checkpoints"])
    head = f"{answer['layout']} checkpoints in {answer['host']}:{answer['directory']}"
    if answer.get("tracker") is not None:
        head += f" (verl tracker: step {answer['tracker']})"
    if not rows:
        return printable(head + ": none yet")
    return printable("\n".join([head, table(["step", "state", "size", "lora r", "world", "why"], rows),
                                f"{len(rows)} checkpoint(s), {human_bytes(total)}"]))


def prune_text(answer: dict[str, Any]) -> str:
    verb = "would remove" if answer["dry_run"] else "removed"
    lines = [f"{verb}: {', '.join(str(c['step']) for c in answer['removed']) or 'nothing'} "
             f"({human_bytes(sum(c['size_bytes'] for c in answer['removed']))})",
             f"kept (complete): {', '.join(str(c['step']) for c in answer['kept']) or 'none'}"]
    for q in answer["quarantined"]:
        where = f" -> {q['moved_to']}" if q["moved_to"] else ""
        lines.append(f"{'would quarantine' if answer['dry_run'] else 'quarantined'} half-written {q['path']}{where}: "
                     f"{q['reason']}")
    return printable("\n".join(lines))
