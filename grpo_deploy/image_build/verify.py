"""In-image checks: the recipe's verify script (bash for .sh, python3 for .py) run from the host's copy inside a
throw-away container of the built image, as the image's own user, with what its labels promise (identity, model path,
role, CUDA, vLLM, TRL and verl versions) in its environment; output to a log, one line on the terminal."""

from __future__ import annotations

from pathlib import Path

from grpo_deploy.hosts import docker_api
from grpo_deploy.hosts.docker_api import image_or_none
from grpo_deploy.image_build.progress import Step, StepFailed
from grpo_deploy.image_build.recipes import Recipe
from grpo_deploy.image_build.tags import MACHINES
from grpo_deploy.names import GID_LABEL, LABEL_PREFIX, MANAGED_BY_LABEL, UID_LABEL

LABELS_TO_ENV = {"EXPECT_ROLE": "image-role", "EXPECT_CUDA": "cuda-version", "EXPECT_VLLM": "vllm-version",
                 "EXPECT_TRL": "trl-version", "EXPECT_VERL": "verl-version", "MODEL": "model-path"}


def expectations(labels: dict[str, str], uid: int | None = None, gid: int | None = None) -> dict[str, str]:
    """The verify script's environment: EXPECT_UID/GID (given, else the labels) and what LABELS_TO_ENV names."""
    env = {"EXPECT_UID": str(uid if uid is not None else labels.get(UID_LABEL, "")),
           "EXPECT_GID": str(gid if gid is not None else labels.get(GID_LABEL, ""))}
    return env | {name: labels.get(f"{LABEL_PREFIX}.{label}", "") for name, label in LABELS_TO_ENV.items()}


EMULATED_MIDR = "0x00000000413fd0c1"
"""An Arm Neoverse-N1 main ID register: what oneDNN (inside torch) reads from sysfs at import on arm64."""


def emulated_cpu_dir(folder: Path, cpus: int = 2) -> Path:
    """A stand-in for /sys/devices/system/cpu in a container of another architecture run under QEMU user emulation:
    qemu-user passes the host's sysfs through, where an x86_64 host has no regs/identification/midr_el1, and torch's
    oneDNN then crashes at import (SIGSEGV). Used for the in-image checks only; real hosts never see it."""
    for n in range(cpus):
        ident = folder / f"cpu{n}" / "regs" / "identification"
        ident.mkdir(parents=True, exist_ok=True)
        (ident / "midr_el1").write_text(EMULATED_MIDR + "\n")
    for name in ("online", "possible", "present"):
        (folder / name).write_text(f"0-{cpus - 1}\n")
    return folder


def emulation_options(client, image, log_dir: Path) -> dict:
    """Options for a throw-away container of *image* when it is not of the engine's architecture (QEMU user
    emulation), else none: the emulated CPU identity, and the image's entrypoint without tini, whose
    PR_SET_CHILD_SUBREAPER qemu-user does not emulate (tini's own presence is one of the checks)."""
    from grpo_deploy.image_build.base import is_foreign

    arch = image.attrs.get("Architecture", "")
    if arch not in MACHINES or not is_foreign(arch, client.info().get("Architecture", "")):
        return {}
    folder = emulated_cpu_dir(log_dir.parent / "emulated-cpu")
    options = {"volumes": {str(folder): {"bind": "/sys/devices/system/cpu", "mode": "ro"}}}
    entrypoint = list(image.attrs.get("Config", {}).get("Entrypoint") or [])
    if entrypoint and entrypoint[0].endswith("/tini"):
        options["entrypoint"] = entrypoint[entrypoint.index("--") + 1:] if "--" in entrypoint else entrypoint[1:]
    return options


def verify(client, recipe: Recipe, images: Path, tag: str, log_dir: Path, uid: int | None = None,
           gid: int | None = None) -> None:
    if recipe.verify is None:
        raise StepFailed(f"the {recipe.name} recipe has no in-image checks")
    image = image_or_none(client, tag)
    if image is None:
        raise StepFailed(f"image {tag} does not exist: build it first (grpo-deploy images build {recipe.name})")
    env = expectations(image.labels or {}, uid, gid)
    script = (images / recipe.verify).read_text()
    command = ["python3", "-c", script] if recipe.verify.endswith(".py") else ["bash", "-c", script]
    with Step(f"verify {tag}", log_dir / f"verify-{recipe.name}.log") as step:
        step.update("running the in-image checks")
        emulated = emulation_options(client, image, log_dir)
        if emulated:
            step.update(f"running the in-image checks under QEMU user emulation ({image.attrs['Architecture']})")
        work = docker_api.for_work(client)
        container = work.containers.run(tag, command, environment=env, detach=True, **emulated,
                                        labels={MANAGED_BY_LABEL: "grpo-deploy-images"})
        try:
            for chunk in container.logs(stream=True, follow=True):
                step.write(chunk.decode(errors="replace"))
            code = container.wait().get("StatusCode", 1)
        finally:
            container.remove(force=True)
        if code != 0:
            raise StepFailed(f"in-image checks failed (exit {code})")
        step.done("all checks passed")
