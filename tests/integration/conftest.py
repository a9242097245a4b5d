"""Integration fixtures: a real Docker engine and the cpu image (built through the kit's own air-gapped path)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from grpo_deploy import facts

REPO = Path(__file__).resolve().parents[2]
CPU_IMAGE = "grpo-deploy/cpu:0.1.0"


@pytest.fixture(scope="session")
def docker_client():
    return facts.docker_client()  # raises (test error, not skip) when no engine answers: CI starts one


@pytest.fixture(scope="session")
def cpu_image(docker_client):
    """Build the cpu image when missing (debootstrap base + host wheelhouse + --no-index install)."""
    if facts.image_labels(docker_client, CPU_IMAGE) is None:
        subprocess.run(["bash", str(REPO / "images" / "build.sh"), "cpu"], check=True)
    labels = facts.image_labels(docker_client, CPU_IMAGE)
    assert labels is not None
    return CPU_IMAGE
