"""The committed defaults of compose/ (the cpu rehearsal): compose/.env and compose/rendered/config/, from the
embedded default spec. `python -m grpo_deploy.compose_defaults` rewrites them; a test checks they are current."""

from __future__ import annotations

from pathlib import Path

from .render import render_files
from .resolve import resolve
from .scaffold import embedded_default

CONFIG_DIR = "./rendered/config"  # relative to compose/, where `docker compose up` runs


def files() -> dict[str, str]:
    """compose/-relative path -> text."""
    rendered = render_files(resolve(embedded_default()), config_dir=CONFIG_DIR)
    out = {f"rendered/{rel}": text for rel, text in rendered.items() if rel.startswith("config/")}
    out[".env"] = rendered["hosts/local.env"]
    return out


def main() -> None:
    root = Path(__file__).resolve().parents[1] / "compose"
    for rel, text in files().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
        print(f"wrote compose/{rel}")


if __name__ == "__main__":
    main()
