"""Integration fixtures: a real Docker engine and the cpu image (built through the kit's own air-gapped path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_deploy import facts, launch, new_spec, resolve

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def docker_client():
    return facts.docker_client()  # raises (test error, not skip) when no engine answers: CI starts one


@pytest.fixture(scope="session")
def cpu_image(docker_client):
    """The embedded default's cpu image, built or refreshed the way `up` does it (debootstrap base + host wheelhouse +
    --no-index install; only the code layer is rebuilt when the kit's code changed)."""
    res = resolve.resolve(new_spec.embedded_default())
    launch.build_images(docker_client, res, print)
    tag = res.images["server"]
    assert facts.image_labels(docker_client, tag) is not None
    return tag
