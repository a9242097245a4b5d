"""The kit's image tags, derived in one place: one tag per image and architecture plus one manifest tag per image.

images/docker-bake.hcl writes the same formula (its `tag` and `manifest_tag` functions), the profiles name per-arch
tags from it, and the cpu recipe's tag (grpo_deploy/image_build/recipes.py) is `CPU_TAG`; tests/static/test_images.py
fails when any of them names a tag this module does not produce."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_deploy import __version__

NAMESPACE = "grpo-deploy"
ARCHES = ("amd64", "arm64")
"""Docker's architecture names (linux/<arch>); hosts report x86_64 / aarch64."""
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
"""Docker's architecture name -> what `uname -m` (and the engine's Architecture) says."""


@dataclass(frozen=True)
class GpuImage:
    name: str
    dockerfile: str
    cuda: str
    """major.minor of the CUDA its torch is built with: its label org.grpo-deploy.cuda-version, checked at build."""
    arches: tuple[str, ...] = ARCHES


GPU_IMAGES: dict[str, GpuImage] = {i.name: i for i in (
    GpuImage("vllm", "images/vllm/Dockerfile", "13.0"),
    GpuImage("trainer", "images/trainer/Dockerfile", "13.0"),
    GpuImage("verl", "images/verl/Dockerfile", "13.0"),
)}
CPU_TAG = f"{NAMESPACE}/cpu:{__version__}"
VERL_CPU_TAG = f"{NAMESPACE}/verl-cpu:{__version__}"
"""The cpu image (built by `grpo-deploy images build cpu` for the machine it runs on; one tag)."""


def cuda_suffix(cuda: str) -> str:
    """'13.0' -> 'cu130'."""
    return "cu" + cuda.replace(".", "")


def arch_tag(image: str, arch: str, version: str = __version__, namespace: str = NAMESPACE) -> str:
    """The tag of one architecture's image, e.g. grpo-deploy/vllm:0.1.0-cu130-arm64 (what a host loads and runs)."""
    return f"{namespace}/{image}:{version}-{cuda_suffix(GPU_IMAGES[image].cuda)}-{arch}"


def manifest_tag(image: str, version: str = __version__, namespace: str = NAMESPACE) -> str:
    """The multi-arch manifest over the per-arch tags, e.g. grpo-deploy/vllm:0.1.0-cu130 (registries only)."""
    return f"{namespace}/{image}:{version}-{cuda_suffix(GPU_IMAGES[image].cuda)}"


def produced() -> set[str]:
    """Every tag the build produces with the default namespace and version."""
    tags = {CPU_TAG, VERL_CPU_TAG}
    for image in GPU_IMAGES.values():
        tags |= {arch_tag(image.name, arch) for arch in image.arches} | {manifest_tag(image.name)}
    return tags

