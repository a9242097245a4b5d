"""Rendered files the kit commits, and how to rewrite them: compose/ defaults (the cpu rehearsal from the embedded
default spec) and each Kubernetes overlay's generated/ (from that overlay's spec.yaml). Tests check both are current;
`python -m grpo_deploy.render.committed` (make render-defaults) rewrites them."""

from __future__ import annotations

import sys
from pathlib import Path

from grpo_deploy.kit_data import KitDataMissing, checkout_dir
from grpo_deploy.render import render_files
from grpo_deploy.render.folder import WriteRefused, check_tree, write_tree
from grpo_deploy.spec.load import load
from grpo_deploy.spec.new_spec import embedded_default
from grpo_deploy.spec.resolve import resolve

COMPOSE_CONFIG_DIR = "./rendered/config"  # relative to compose/, where `docker compose up` runs


def compose_files() -> dict[str, str]:
    """compose/-relative path -> text."""
    rendered = render_files(resolve(embedded_default()), config_dir=COMPOSE_CONFIG_DIR)
    out = {f"rendered/{rel}": text for rel, text in rendered.items() if rel.startswith("config/")}
    out[".env"] = rendered["hosts/local.env"]
    return out


def k8s_overlays(root: Path | None = None) -> list[Path]:
    root = root or checkout_dir() / "k8s"
    return sorted(p for p in root.iterdir() if (p / "spec.yaml").exists()) if root.is_dir() else []


def k8s_generated(overlay: Path) -> dict[str, str]:
    """generated/-relative path -> text: the run config files plus what the render writes for kustomize (k8s/:
    params.env, placement.yaml, admin/). A k8s/ file of the same name as a config/ one is the pods' own and takes its
    place (trl-async: server.args with vLLM on the pod's loopback behind the front)."""
    rendered = render_files(resolve(load(overlay / "spec.yaml")))
    out = {rel.split("/", 1)[1]: text for rel, text in rendered.items() if rel.startswith("config/")}
    out.update({rel.split("/", 1)[1]: text for rel, text in rendered.items() if rel.startswith("k8s/")})
    return out


def renders() -> dict[Path, dict[str, str]]:
    """Each folder the committed renders are written to (its record, rendered.RECORD, lands there) -> its files. An
    overlay's record sits in the overlay, beside generated/, which holds only the render."""
    out = {checkout_dir() / "compose": compose_files()}
    for overlay in k8s_overlays():
        out[overlay] = {f"generated/{rel}": text for rel, text in k8s_generated(overlay).items()}
    return out


def main() -> int:
    """Rewrite every committed render through the one render writer, all checked before any is written. Files written
    before the kit kept records are adopted when equal to the render; a differing one is refused."""
    try:
        folders = renders()
        for folder, files in folders.items():
            check_tree(files, folder, adopt=True)
        for folder, files in folders.items():
            for path in write_tree(files, folder, adopt=True):
                print(f"wrote {path.relative_to(checkout_dir())}")
    except (WriteRefused, KitDataMissing) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
