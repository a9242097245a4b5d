"""The images a run needs, on this machine before `up` ships them: the cpu profile's images (the cpu image, the
verl-cpu image) built or refreshed from their recipes (in-process, one progress line per step), a missing GPU image
named with how to build it."""

from __future__ import annotations

import time
from collections.abc import Callable

from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.hosts import local_facts
from grpo_deploy.names import GID_LABEL, UID_LABEL
from grpo_deploy.spec.resolve import Resolved


def build_images(client, res: Resolved, log: Callable[[str], None]) -> float:
    """Build or refresh local images in-process (grpo_deploy.image_build: one progress line per step, full output in
    a log whose path is printed). Returns the seconds spent building (0 when every image was current), which `up`
    records so its start-up figure can leave build time out.

    The cpu image is handed to the build even when it exists: the build compares its inputs' hash with the image's
    label and returns in seconds when nothing changed, and rebuilds only the code layer when the kit's code did, so
    a kit update never runs against an image holding older runtime code.
    """
    from grpo_deploy.image_build import build as image_build
    from grpo_deploy.image_build import places
    from grpo_deploy.image_build.door import BadValue
    from grpo_deploy.image_build.progress import StepFailed
    from grpo_deploy.image_build.recipes import RECIPES

    spent = 0.0
    profile = res.profiles[res.spec.hosts[0].name]
    by_tag = {r.tag: r for r in RECIPES.values() if r.tag}
    for tag in sorted(set(res.images.values())):
        labels = local_facts.image_labels(client, tag)
        cpu = profile.name == "cpu"
        # the recipe of the profile's own tag for this image (a spec may name another tag for the same image)
        key = next(k for k, v in res.images.items() if v == tag)
        recipe = by_tag.get(profile.images.get(key, tag), RECIPES["cpu"])
        if labels is not None and not (cpu and res.spec.images.build):
            continue
        if not res.spec.images.build:
            raise LaunchError(f"image {tag} is not on the local engine and images.build is false: load or build it")
        if not cpu:
            airgap = [r.name for r in RECIPES.values() if r.tag == tag]
            how = f"`grpo-deploy images build {' '.join(airgap)}` (from wheels, no registry) or " if airgap else ""
            raise LaunchError(f"image {tag} is missing; build it with {how}`docker buildx bake -f "
                              "images/docker-bake.hcl` in a checkout on a machine of that architecture (see "
                              "images/README.md), then load it on the host")
        if labels is not None:  # keeps the UID/GID it was built for; preflight says when the run wants another
            uid, gid = int(labels.get(UID_LABEL, "1000")), int(labels.get(GID_LABEL, "1000"))
        else:
            main = res.identities[res.engine_info.main_role]
            uid, gid = main.uid, main.gid
            log(f"building {tag} for UID {uid}:{gid} (a first build installs ~3.5 GB of wheels: minutes)")
        start = time.monotonic()
        retry = f"grpo-deploy images build {recipe.name} --tag {tag} --uid {uid} --gid {gid}"
        try:
            result = image_build.build(client, recipe, places.images_dir(), places.package_dir(),
                                       places.build_dir(), tag=tag, uid=uid, gid=gid)
        except (StepFailed, BadValue) as exc:
            raise LaunchError(f"building {tag} failed: {exc}; retry with: {retry}") from None
        if result.code_built or result.deps_built:
            spent += time.monotonic() - start
        else:
            log(f"{tag} is current (its inputs are unchanged)")
    return spent
