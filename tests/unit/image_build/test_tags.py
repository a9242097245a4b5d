"""Tests of grpo_deploy.image_build.tags: the per-architecture and manifest tags of each image, from one formula."""

from __future__ import annotations

import re

import pytest

from grpo_deploy import __version__
from grpo_deploy.image_build import tags


def test_cuda_suffix_drops_the_dot():
    assert tags.cuda_suffix("13.0") == "cu130" and tags.cuda_suffix("12.9") == "cu129"


def test_arch_and_manifest_tags_follow_the_formula():
    assert tags.arch_tag("vllm", "arm64", "0.1.0") == "grpo-deploy/vllm:0.1.0-cu130-arm64"
    assert tags.manifest_tag("trainer", "0.1.0") == "grpo-deploy/trainer:0.1.0-cu130"
    assert tags.arch_tag("verl", "amd64", "2.0", namespace="reg:5000/team") == "reg:5000/team/verl:2.0-cu130-amd64"
    with pytest.raises(KeyError):
        tags.arch_tag("nope", "amd64")


def test_produced_is_every_arch_tag_every_manifest_and_the_cpu_tags():
    made = tags.produced()
    assert len(made) == len(tags.GPU_IMAGES) * (len(tags.ARCHES) + 1) + 2
    assert {tags.CPU_TAG, tags.VERL_CPU_TAG} <= made and tags.CPU_TAG == f"grpo-deploy/cpu:{__version__}"
    for image in tags.GPU_IMAGES:
        assert tags.manifest_tag(image) in made
        assert {tags.arch_tag(image, arch) for arch in tags.ARCHES} <= made
    assert all(re.fullmatch(r"grpo-deploy/[a-z-]+:[0-9A-Za-z.+-]+", t) for t in made), made


def test_every_arch_has_its_machine_name():
    assert tags.MACHINES == {"amd64": "x86_64", "arm64": "aarch64"} and set(tags.ARCHES) == set(tags.MACHINES)
