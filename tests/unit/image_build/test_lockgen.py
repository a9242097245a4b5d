"""grpo_deploy.image_build.lockgen: a real offline resolve (pip --dry-run --report against a find-links folder) writes
a lock whose pins and hashes are those of the wheels, with its header; Dockerfile ARG templates expand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from grpo_deploy.image_build import lockgen, locks, wheelhouse
from grpo_deploy.image_build.progress import StepFailed
from grpo_deploy.image_build.recipes import RECIPES

IMAGES = Path(__file__).resolve().parents[3] / "images"


def test_lock_resolves_offline_from_find_links_into_hashed_pins(tmp_path: Path):
    pins = [p for p in locks.read(IMAGES / "cpu" / "requirements.lock") if p.key in ("idna", "packaging")]
    images = tmp_path / "images"
    (images / "cpu").mkdir(parents=True)
    (images / "cpu" / "requirements.lock").write_text("".join(p.line + "\n" for p in pins))
    (images / "cpu" / "requirements.in").write_text("idna==3.20\npackaging\n")
    recipe = replace(RECIPES["cpu"], name="small", lock_excluded=())
    wheelhouse.ensure(recipe, images, tmp_path / "wheels", tmp_path / "logs")
    (images / "cpu" / "requirements.lock").write_text("# stale\n")
    lockgen.lock(recipe, images, tmp_path / "logs", find_links=tmp_path / "wheels")
    text = (images / "cpu" / "requirements.lock").read_text()
    assert text.startswith("# Full pinned set of the small image's environment (linux/amd64, CPython 3.11)")
    assert "grpo-deploy images lock small" in text
    assert sorted(p.line for p in locks.parse(text)) == sorted(p.line for p in pins)


def test_templates_expand_from_dockerfile_args_and_a_missing_arg_says_where(tmp_path: Path):
    assert lockgen.expand("trl=={trainer/Dockerfile:TRL_VERSION}", IMAGES).startswith("trl==1.")
    (tmp_path / "Dockerfile").write_text("ARG X\nARG Y=2\n")
    assert lockgen.expand("a=={Dockerfile:Y}", tmp_path) == "a==2"
    with pytest.raises(StepFailed, match="no 'ARG X=' default in"):
        lockgen.expand("a=={Dockerfile:X}", tmp_path)
