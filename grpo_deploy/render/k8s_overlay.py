"""A Kubernetes overlay (k8s/<name>/: spec.yaml, kustomization.yaml, generated/) as a user edits and applies it:
render its generated/ from its spec, and the check before `kubectl apply -k` that refuses what only the user can set
and has not (the placeholder NFS address, an image without a registry or with a placeholder one) and a stale
generated/. Pure but for reading the overlay and writing generated/ through the one render writer."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from grpo_deploy.render.committed import k8s_generated
from grpo_deploy.render.folder import WriteRefused, diff_tree, write_tree
from grpo_deploy.render.k8s import secret_commands
from grpo_deploy.spec.load import load
from grpo_deploy.spec.resolve import resolve

# Addresses and names reserved for documentation and examples (RFC 5737, RFC 3849, RFC 2606/6761): the kit's
# placeholders, never a real NFS server or registry.
DOCUMENTATION_NETS = tuple(ipaddress.ip_network(n) for n in
                           ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))
PLACEHOLDER_TLDS = ("invalid", "example", "test")
PLACEHOLDER_DOMAINS = ("example.com", "example.net", "example.org")
CI_OVERLAYS = ("cpu",)  # overlays that exist for CI only: `check` says so instead of passing them


class OverlayError(Exception):
    """The overlay cannot be used as given; the message is one line: what, where, how to fix."""


def overlay_dir(text: str) -> Path:
    """The OVERLAY argument: a directory holding spec.yaml and kustomization.yaml."""
    path = Path(text)
    if any(ch in text for ch in "\n\r\0") or not path.is_dir():
        raise OverlayError(f"{text!r} is not a directory: give an overlay such as k8s/h200")
    for name in ("spec.yaml", "kustomization.yaml"):
        if not (path / name).is_file():
            raise OverlayError(f"{text}: no {name} here: give an overlay folder (k8s/<name>/ with spec.yaml and "
                               "kustomization.yaml)")
    return path


def placeholder_host(host: str) -> bool:
    """A documentation address or an example/invalid domain (the kit's placeholders)."""
    name = host.split("@")[-1].strip("[]").lower().rstrip(".")
    try:
        return any(ipaddress.ip_address(name) in net for net in DOCUMENTATION_NETS if
                   ipaddress.ip_address(name).version == net.version)
    except ValueError:
        return name.rsplit(".", 1)[-1] in PLACEHOLDER_TLDS or any(
            name == d or name.endswith("." + d) for d in PLACEHOLDER_DOMAINS)


def image_registry(image: str) -> str | None:
    """The registry host of an image reference, None when it names none (then a node pulls from its default)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def regenerate(overlay: Path) -> list[Path]:
    """Rewrite generated/ from spec.yaml; only files the kit wrote there are replaced (the overlay's record)."""
    files = {f"generated/{rel}": text for rel, text in k8s_generated(overlay).items()}
    try:
        return write_tree(files, overlay, adopt=True)
    except WriteRefused as exc:
        raise OverlayError(str(exc)) from None


def secret_lines(overlay: Path) -> list[str]:
    """What the user creates once before the first apply, one line each: the Secrets the pods need (the run's
    token), each with the command that makes it. SpecError propagates."""
    res = resolve(load(overlay / "spec.yaml"))
    return [f"required once, in the run's namespace (after admin/, before the first `kubectl apply -k {overlay}`; "
            f"the pods do not start without it, the kit renders no value): {cmd}" for cmd in secret_commands(res)]


def problems(overlay: Path) -> list[str]:
    """What stops this overlay from being applied, one line each (empty: ready). SpecError propagates."""
    spec_file = overlay / "spec.yaml"
    res = resolve(load(spec_file))
    out: list[str] = []
    if overlay.resolve().name in CI_OVERLAYS:
        out.append(f"{overlay}: a CI-only overlay (the cpu rehearsal); apply one of the GPU overlays")
    many = [h.name for h in res.spec.hosts if (h.replicas or 1) > 1] if res.engine_info.replica_role else []
    if many or len(res.hosts_with(res.engine_info.replica_role or "")) > 1:
        out.append(f"{spec_file}: several vLLM server replicas ({', '.join(many) or 'several server hosts'}): the "
                   "Kubernetes overlays run one server and no replica proxy yet; use one server host with "
                   "replicas: 1 here, or `grpo-deploy up` over SSH for replicas")
    trainers = res.hosts_with("trainer")
    if len(trainers) > 1:
        out.append(f"{spec_file}: {len(trainers)} hosts with role trainer ({', '.join(h.name for h in trainers)}): "
                   "the Kubernetes overlays run one trainer pod; use one trainer host here, or `grpo-deploy up` over "
                   "SSH for a trainer across hosts")
    elif (ranks := res.engine_info.trainer_processes(res)) > 1:
        out.append(f"{spec_file}: overrides.runtime.trainer_processes is {ranks}: the "
                   "Kubernetes overlays give the trainer pod one GPU and run one process; remove it here, or use "
                   "`grpo-deploy up` over SSH for a trainer of several processes")
    nfs = res.spec.storage.nfs
    if nfs is not None and placeholder_host(nfs.server):
        out.append(f"{spec_file}: storage.nfs.server {nfs.server} is the placeholder documentation address: set your "
                   f"NFS server's address, then run grpo-deploy k8s render {overlay}")
    for role, image in sorted(res.images.items()):
        registry = image_registry(image)
        if registry is None:
            out.append(f"{spec_file}: images.{role} {image} names no registry (a node would pull it from its default "
                       f"public one): push the image and set images.{role}: REGISTRY/{image}[@sha256:DIGEST]")
        elif placeholder_host(registry.split(":")[0]):
            out.append(f"{spec_file}: images.{role} {image} names the placeholder registry {registry}: push the image "
                       f"to your registry and set images.{role} to it")
    rendered = {f"generated/{rel}": text for rel, text in k8s_generated(overlay).items()}
    stale = [line for line in diff_tree(rendered, overlay) if line.split()[1].startswith("generated/")]
    if stale:
        out.append(f"{overlay}/generated/ differs from a render of spec.yaml ({stale[0]}): run "
                   f"grpo-deploy k8s render {overlay}")
    return out
