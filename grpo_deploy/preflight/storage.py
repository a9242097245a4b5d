"""Checks of the storage the roles share: identity and umask, disk space for the checkpoints, the shared-volume probe;
and the checkpoint headroom that status shows."""

from __future__ import annotations

import json
from typing import Any

from grpo_deploy.common.shown import printable
from grpo_deploy.hosts import oneoff
from grpo_deploy.plan import make_plan
from grpo_deploy.preflight.images import image_on
from grpo_deploy.preflight.registry import FAIL, OK, SKIP, WARN, Result, check
from grpo_deploy.preflight.session import Context, measured_free_space, storage_host
from grpo_deploy.spec.resolve import Resolved


def checkpoint_headroom(ctx: Context) -> dict[str, Any] | None:
    """For a running run (status): free space where checkpoints are written against the next checkpoint plus the
    margin. None when the model's size or the free space is unknown."""
    free, filesystem, source = measured_free_space(ctx)  # what is free now: the run's own checkpoints are not
    # free for the next save (one measurement: status stays quick)
    disk = make_plan(ctx.res, free, filesystem, source).disk if free is not None else None
    if disk is None:
        return None
    need = disk.checkpoint_bytes + disk.margin_bytes
    return {"filesystem": disk.filesystem, "free_bytes": free, "checkpoint_bytes": disk.checkpoint_bytes,
            "margin_bytes": disk.margin_bytes, "ok": free >= need}


def headroom_text(h: dict[str, Any] | None) -> str:
    if h is None:
        return "  checkpoint disk     free space unknown (grpo-deploy preflight says why)"
    line = (f"  checkpoint disk     {h['free_bytes'] / 1e9:.1f} GB free; next checkpoint "
            f"{h['checkpoint_bytes'] / 1e9:.2f} GB + {h['margin_bytes'] / 1e9:.1f} GB margin ({h['filesystem']})")
    warning = "\n  WARNING: the next checkpoint may not fit: free space, or lower checkpoints.keep"
    return printable(line if h["ok"] else line + warning)  # the filesystem's name: what the host's df said


@check("identity", "Trainer and server run as the same non-root UID/GID with a umask that keeps files readable")
def check_identity(ctx: Context) -> list[Result]:
    res = ctx.res
    roles = res.engine_info.roles
    ids = {r: res.identities[r] for r in roles}
    first = ids[roles[0]]
    other = next((r for r in roles[1:] if (ids[r].uid, ids[r].gid) != (first.uid, first.gid)), None)
    if other is not None:
        second = ids[other]
        return [Result(
            "identity", "-", FAIL,
            f"{other} runs as UID {second.uid}:{second.gid} umask {second.umask}, {roles[0]} as UID "
            f"{first.uid}:{first.gid}: adapter_model.safetensors is written 0600 (safetensors 0.8.0, whatever the "
            f"umask), so the {roles[0]} cannot read {res.checkpoint_dir}/... and vLLM answers 404 (TRL reports "
            "'does not expose /v1/load_lora_adapter')",
            "remove run.roles overrides so both roles run as run.uid/run.gid")]
    bad = [f"{r} umask {i.umask}" for r, i in ids.items() if int(i.umask, 8) & 0o700]
    if bad:
        return [Result("identity", "-", FAIL, f"{', '.join(bad)} denies the run user itself",
                       "use umask 0022 (or 0002)")]
    return [Result("identity", "-", OK, f"both roles run as {first.uid}:{first.gid}, umask {first.umask}")]


@check("disk", "Checkpoints x (retention + 1) + adapters + margin fit the free space where they are written")
def check_disk(ctx: Context) -> list[Result]:
    plan = ctx.plan()
    host = storage_host(ctx.res).name
    disk = plan.disk
    if disk is None:
        return [Result("disk", host, WARN, "; ".join(plan.warnings), "set model.architecture in the spec")]
    if disk.fits is None:
        return [Result("disk", host, SKIP, f"free space of {disk.filesystem} unknown ({disk.free_source}); "
                                            f"need {disk.peak_bytes / 1e9:.1f} GB")]
    data = {"need_bytes": disk.peak_bytes, "free_bytes": disk.free_bytes, "filesystem": disk.filesystem}
    if disk.fits:
        return [Result("disk", host, OK, f"need {disk.peak_bytes / 1e9:.1f} GB at peak, {disk.free_bytes / 1e9:.1f} GB "
                                          f"free on {disk.filesystem}", data=data)]
    return [Result("disk", host, FAIL, disk.explanation[-2], disk.explanation[-1], data=data)]


def _in_container(ctx: Context, host, image: str, ident, argv: list[str]):
    """Run argv in a throw-away container of *image* on *host*, as *ident*, with the shared storage mounted."""
    return oneoff.run(ctx.connector(host), image, argv, ident=ident, share=(ctx.res, host))


@check("shared-volume", "The trainer's adapter files, written as the trainer identity on the trainer host, are read "
                        "as the server identity on the server host through the real shared storage",
       needs_images=True)
def check_shared_volume(ctx: Context) -> list[Result]:
    """Writes a real safetensors probe the way the trainer saves adapters, then reads it as the server would; with
    the main role on several hosts (a trainer over several hosts: every rank saves its shards), each of the others
    writes one that the first host reads (a checkpoint must be whole on one share)."""
    res = ctx.res
    main = res.engine_info.main_role
    readers = res.hosts_with(res.engine_info.reader_role)
    writers = res.hosts_with(main)
    if not readers and len(writers) < 2:
        return [Result("shared-volume", "-", SKIP, f"no {res.engine_info.reader_role} host reads what the "
                       f"{main} writes on the share")]
    return [shared_volume_probe(ctx, main, res.engine_info.reader_role, reader) for reader in readers] + \
        [shared_volume_probe(ctx, main, main, writers[0], w_host=other) for other in writers[1:]]


def shared_volume_probe(ctx: Context, writer: str, reader: str, r_host=None, w_host=None) -> Result:
    """The probe between two roles' hosts, in their images, as their identities (the testinfra check
    `shared_dir_cross_host_write_read` gives this same verdict through its own connectors): *writer* saves a real
    safetensors file on the share the way adapters and checkpoints are saved; *reader* reads it on its host."""
    res = ctx.res
    w_host, r_host = w_host or res.host_for(writer), r_host or res.host_for(reader)
    where = w_host.name if w_host.name == r_host.name else f"{w_host.name}->{r_host.name}"
    for host, role in ((w_host, writer), (r_host, reader)):
        image = res.image_for(role)
        present = image_on(ctx, host, image)
        if present is not True:
            return Result("shared-volume", where, SKIP, present or f"image {image} is not on {host.name} yet: `up` "
                          "ships it and probes then")
    w_ident, r_ident = res.identities[writer], res.identities[reader]
    probe_dir = f"{res.run_dir}/.preflight-probe"
    w = _in_container(ctx, w_host, res.image_for(writer), w_ident,
                      ["python3", "-m", "grpo_deploy.runtime.storage.share_probe", "write", "--dir", probe_dir])
    if oneoff.engine_error(w) is not None:
        return _cannot_start(res, where, w_host.name, oneoff.engine_error(w))
    if not w.ok:
        return Result("shared-volume", where, FAIL,
                      f"the {writer} identity UID {w_ident.uid}:{w_ident.gid} (umask {w_ident.umask}) cannot write "
                      f"{probe_dir} on {w_host.name}: {w.line()}",
                      f"make {w_host.shared_dir or res.spec.storage.mount} writable by UID {w_ident.uid} (directory "
                      "owner, NFS export owner)")
    written = _last_json(w.out)
    # The reader also removes the probe when it can (same identity: the usual case), saving a container start;
    # otherwise the writer's identity cleans up.
    r = _in_container(ctx, r_host, res.image_for(reader), r_ident,
                      ["sh", "-c", 'python3 -m grpo_deploy.runtime.storage.share_probe read --dir "$0"; rc=$?; '
                       'rm -rf "$0" 2>/dev/null; exit $rc', probe_dir])
    read = _last_json(r.out)
    if (w_ident.uid, w_ident.gid) != (r_ident.uid, r_ident.gid) or not r.ok:
        _in_container(ctx, w_host, res.image_for(writer), w_ident, ["rm", "-rf", probe_dir])
    if oneoff.engine_error(r) is not None:
        return _cannot_start(res, where, r_host.name, oneoff.engine_error(r))
    path = written.get("path", probe_dir)
    data = {"written": written, "read": read}
    if not r.ok or not read.get("ok", False):
        errors = "; ".join(f"{e.get('path')}: {e.get('error')}" for e in read.get("errors", [])) or r.line()
        missing = "No such file" in errors or "not found" in errors.lower()
        cause = (f"the {reader} host {r_host.name} does not see the file the {writer} host {w_host.name} wrote: the "
                 "two shared directories are not the same storage" if missing and w_host.name != r_host.name else
                 f"the {reader} (UID {r_ident.uid}:{r_ident.gid}) cannot read the adapter probe {path} written by the "
                 f"{writer} (UID {w_ident.uid}:{w_ident.gid}, umask {w_ident.umask}, file mode "
                 f"{written.get('file_mode')}, dir mode {written.get('dir_mode')})")
        then = res.engine_info.unreadable_share
        return Result(
            "shared-volume", where, FAIL, f"{cause}: {errors}" + (f". {then}" if then else ""),
            "mount the same share on both hosts (hosts[].shared_dir or storage.nfs)" if missing else
            "run both roles as the same UID/GID (remove run.roles overrides) with umask 0022", data)
    return Result("shared-volume", where, OK,
                  f"probe {path} written on {w_host.name} as {w_ident.uid}:{w_ident.gid} (file "
                  f"{written.get('file_mode')}) and read on {r_host.name} as {r_ident.uid}:{r_ident.gid}", data=data)


def _cannot_start(res: Resolved, where: str, host_name: str, error: str) -> Result:
    """The probe's container never started: the engine's own error, and the fix for the cause it names."""
    return Result("shared-volume", where, FAIL, f"a container with the share mounted cannot start on {host_name}: "
                  f"{error}", oneoff.start_failure_fix(res, host_name, error))


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return {}
