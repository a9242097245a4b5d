"""The kit's own images as the tests use them: built or refreshed the way `up` does it (in-process, the code layer
only when the kit's code changed), by name: the embedded default's cpu image and the cpu profile's verl image."""

from __future__ import annotations

from collections.abc import Callable


def _spec_texts() -> dict[str, Callable[[], str]]:
    from grpo_deploy.spec import new_spec

    return {"cpu": new_spec.spec_text, "verl-cpu": lambda: new_spec.spec_text("cpu", "verl", [])}


NAMES = ("cpu", "verl-cpu")


def client():
    """The kit's own Docker client (grpo_deploy.hosts.docker_api), the product's timeouts."""
    from grpo_deploy.hosts import docker_api

    return docker_api.client()


def build(docker_client, name: str) -> str:
    """Image *name* (one of NAMES) built or found current; its tag."""
    from grpo_deploy import spec
    from grpo_deploy.deploy import images as run_images
    from grpo_deploy.hosts import local_facts
    from grpo_deploy.spec import resolve

    res = resolve.resolve(spec.loads(_spec_texts()[name](), source=f"{name}-image.yaml"))
    run_images.build_images(docker_client, res, print)
    tag = next(iter(res.images.values()))
    assert local_facts.image_labels(docker_client, tag) is not None, f"{tag} is not on the engine after its build"
    return tag
