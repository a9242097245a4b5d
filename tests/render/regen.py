"""Regenerate the golden render cases: python -m tests.render.regen (review the diff before committing)."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpo_deploy import render, spec
from grpo_deploy.spec import resolve

CASES = Path(__file__).resolve().parent
CONFIG_DIR = "/srv/grpo-render/config"


def render_case(case: Path) -> dict[str, str]:
    return render.render_files(resolve.resolve(spec.load(case / "spec.yaml")), config_dir=CONFIG_DIR)


def main() -> None:
    for case in sorted(p for p in CASES.iterdir() if (p / "spec.yaml").exists()):
        expected = case / "expected"
        shutil.rmtree(expected, ignore_errors=True)
        for rel, text in render_case(case).items():
            (expected / rel).parent.mkdir(parents=True, exist_ok=True)
            (expected / rel).write_text(text, encoding="utf-8")
        print(f"regenerated {case.name}")


if __name__ == "__main__":
    main()
