"""Rendered files the kit commits, and how to rewrite them: compose/ defaults (the cpu rehearsal from the embedded
default spec) and each Kubernetes overlay's generated/ (from that overlay's spec.yaml). Tests check both are current;
`python -m grpo_deploy.committed` (make render-defaults) rewrites them."""

from __future__ import annotations

from pathlib import Path

from .compose import KIT_ROOT
from .render import render_files
from .rendered import write_tree
from .resolve import resolve
from .scaffold import embedded_default
from .spec import load

COMPOSE_CONFIG_DIR = "./rendered/config"  # relative to compose/, where `docker compose up` runs


def compose_files() -> dict[str, str]:
    """compose/-relative path -> text."""
    rendered = render_files(resolve(embedded_default()), config_dir=COMPOSE_CONFIG_DIR)
    out = {f"rendered/{rel}": text for rel, text in rendered.items() if rel.startswith("config/")}
    out[".env"] = rendered["hosts/local.env"]
    return out


def k8s_overlays(root: Path = KIT_ROOT / "k8s") -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / "spec.yaml").exists()) if root.is_dir() else []


def k8s_generated(overlay: Path) -> dict[str, str]:
    """generated/-relative path -> text: the run config files plus the params kustomize replacements read."""
    rendered = render_files(resolve(load(overlay / "spec.yaml")))
    out = {rel.split("/", 1)[1]: text for rel, text in rendered.items() if rel.startswith("config/")}
    out["params.env"] = rendered["k8s/params.env"]
    return out


def _write(folder: Path, files: dict[str, str], clean: bool = False) -> None:
    for path in write_tree(files, folder, clean=clean):
        print(f"wrote {path.relative_to(KIT_ROOT)}")


def main() -> None:
    _write(KIT_ROOT / "compose", compose_files())
    for overlay in k8s_overlays():
        _write(overlay / "generated", k8s_generated(overlay), clean=True)


if __name__ == "__main__":
    main()
