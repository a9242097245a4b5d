"""In-image checks: the recipe's verify script run with bash inside a throw-away container of the built image, as the
image's own user, with the identity and model path its labels promise; output to a log, one line on the terminal."""

from __future__ import annotations

from pathlib import Path

from .build import image_or_none
from .progress import Step, StepFailed
from .recipes import Recipe


def verify(client, recipe: Recipe, images: Path, tag: str, log_dir: Path, uid: int | None = None,
           gid: int | None = None) -> None:
    if recipe.verify is None:
        raise StepFailed(f"the {recipe.name} recipe has no in-image checks")
    image = image_or_none(client, tag)
    if image is None:
        raise StepFailed(f"image {tag} does not exist: build it first (grpo-deploy images build {recipe.name})")
    labels = image.labels or {}
    env = {"EXPECT_UID": str(uid if uid is not None else labels.get("org.grpo-deploy.uid", "")),
           "EXPECT_GID": str(gid if gid is not None else labels.get("org.grpo-deploy.gid", "")),
           "MODEL": labels.get("org.grpo-deploy.model-path", "")}
    script = (images / recipe.verify).read_text()
    with Step(f"verify {tag}", log_dir / f"verify-{recipe.name}.log") as step:
        step.update("running the in-image checks")
        container = client.containers.run(tag, ["bash", "-c", script], environment=env, detach=True,
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
