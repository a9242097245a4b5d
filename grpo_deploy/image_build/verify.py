"""In-image checks: the recipe's verify script (bash for .sh, python3 for .py) run from the host's copy inside a
throw-away container of the built image, as the image's own user, with what its labels promise (identity, model path,
role, CUDA, vLLM and TRL versions) in its environment; output to a log, one line on the terminal."""

from __future__ import annotations

from pathlib import Path

from .build import image_or_none
from .progress import Step, StepFailed
from .recipes import Recipe

LABELS_TO_ENV = {"EXPECT_ROLE": "image-role", "EXPECT_CUDA": "cuda-version", "EXPECT_VLLM": "vllm-version",
                 "EXPECT_TRL": "trl-version", "MODEL": "model-path"}


def expectations(labels: dict[str, str], uid: int | None = None, gid: int | None = None) -> dict[str, str]:
    """The verify script's environment: EXPECT_UID/GID (given, else the labels) and what LABELS_TO_ENV names."""
    env = {"EXPECT_UID": str(uid if uid is not None else labels.get("org.grpo-deploy.uid", "")),
           "EXPECT_GID": str(gid if gid is not None else labels.get("org.grpo-deploy.gid", ""))}
    return env | {name: labels.get(f"org.grpo-deploy.{label}", "") for name, label in LABELS_TO_ENV.items()}


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
        container = client.containers.run(tag, command, environment=env, detach=True,
                                          labels={"org.grpo-deploy.managed-by": "grpo-deploy-images"})
        try:
            for chunk in container.logs(stream=True, follow=True):
                step.write(chunk.decode(errors="replace"))
            code = container.wait().get("StatusCode", 1)
        finally:
            container.remove(force=True)
        if code != 0:
            raise StepFailed(f"in-image checks failed (exit {code})")
        step.done("all checks passed")
