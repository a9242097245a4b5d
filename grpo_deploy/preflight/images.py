"""Checks of the run's images: present here or on their hosts, built for the run's UID, one vLLM version in trainer
and server; which images each host runs and whether one is there."""

from __future__ import annotations

from typing import Any

from grpo_deploy.hosts import facts as host_facts
from grpo_deploy.hosts import local_facts
from grpo_deploy.hosts.connect import HostError
from grpo_deploy.names import GID_LABEL, UID_LABEL, VLLM_VERSION_LABEL
from grpo_deploy.preflight.registry import FAIL, OK, WARN, Result, check
from grpo_deploy.preflight.session import Context, image_roles
from grpo_deploy.spec.resolve import Resolved

TRL_VLLM_GATE = ((0, 22, 0), (0, 31, 0))  # trl 1.16.0: vllm>=0.22.0,<=0.31.0


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("+")[0].split("."):
        digits = "".join(c for c in p if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


@check("images", "Images exist (or will be built), run as the run UID, and trainer/server carry the same vLLM",
       reads_images=True)
def check_images(ctx: Context) -> list[Result]:
    res = ctx.res
    client = ctx.docker()  # this machine's engine: local hosts run from it, remote hosts get images shipped from it
    out, versions = [], {}
    for host, role, tag in images_needed(res):
        found = ctx.facts_of(host)
        if isinstance(found, HostError):
            continue
        here = local_facts.image_labels(client, tag) if client is not None else None
        there = (found["images"].get(role) or {}).get("labels") if found["images"].get(role) else None
        labels = there if there is not None else here  # on this machine's engine only: `up` ships it from here
        shipped = "" if there is not None else f" (not on {host.name} yet: `up` ships it from this machine)"
        label = f"{role}@{host.name}"
        if labels is None:
            verdict = WARN if res.spec.images.build else FAIL
            where = "this machine's engine" if ctx.connector(host).is_local else f"{host.name} or this machine"
            out.append(Result("images", label, verdict, f"{tag} is not on {where}",
                              "`grpo-deploy up` builds it (images.build: true), or `make images`"
                              if res.spec.images.build else "build or load it, or set images.build: true"))
            continue
        uid, gid = labels.get(UID_LABEL), labels.get(GID_LABEL)
        ident = res.identities.get(role) or res.main_identity
        versions[role] = labels.get(VLLM_VERSION_LABEL, "?")
        if uid is not None and (int(uid), int(gid or -1)) != (ident.uid, ident.gid):
            out.append(Result("images", label, FAIL,
                              f"{tag} was built for UID {uid}:{gid}, the run uses {ident.uid}:{ident.gid}: the "
                              "container user would have no passwd entry or HOME (PyTorch's getpass crashes)",
                              f"rebuild with --uid {ident.uid} --gid {ident.gid} or set run.uid/run.gid to the "
                              "image's"))
        else:
            out.append(Result("images", label, OK, f"{tag}: user {uid}:{gid}, vLLM {versions[role]}{shipped}"))
    if set(versions) == {"server", "trainer"}:  # a separate server: its vLLM and the trainer's must agree
        server_v, trainer_v = versions["server"], versions["trainer"]
        if server_v != trainer_v:
            out.append(Result("images", "vllm-version", FAIL,
                              f"trainer image has vLLM {trainer_v}, server {server_v}: TRL picks its weight-sync API "
                              "by the local vLLM version and would call an API the server does not have",
                              "build the trainer FROM the server image"))
        else:
            low, high = TRL_VLLM_GATE
            v = _version_tuple(server_v)
            if not v or (v < low):
                out.append(Result("images", "vllm-version", FAIL,
                                  f"vLLM {server_v!r} reads as older than TRL 1.16's minimum 0.22.0 (a dev version "
                                  "string such as 0.28.0.dev0+g... sorts before the release and TRL picks the wrong "
                                  "weight-sync API)",
                                  "use a release build, e.g. vllm/vllm-openai:v0.31.0"))
            elif v > high:
                out.append(Result("images", "vllm-version", WARN,
                                  f"vLLM {server_v} is newer than TRL 1.16's tested range (<= 0.31.0); the >= 0.28 API "
                                  "it imports exists there (verified on the CPU build)"))
            else:
                out.append(Result("images", "vllm-version", OK, f"trainer and server both vLLM {server_v}"))
    return out


def images_needed(res: Resolved) -> list[tuple[Any, str, str]]:
    """(host, image key, tag) for every image every host runs."""
    return [(host, key, res.images[key]) for host in res.spec.hosts for key in image_roles(res, host)]


def image_on(ctx: Context, host, tag: str) -> bool | str:
    """True when *tag* is on *host*'s engine; else why not (a message). Asked alone (the testinfra probe) when the
    session has gathered no facts."""
    if ctx.gathered and isinstance(ctx.facts_of(host), HostError):
        return f"{host.name} unreachable (see the reachable check)"
    try:
        return host_facts.image(ctx.connector(host), tag) is not None
    except HostError as exc:
        return f"{host.name} unreachable ({exc.what})"
