"""The arm64 CUDA images, built in the background when a session has selected a test that needs them: under QEMU user
emulation their dependency image takes about 15 minutes of one core, which the rest of the suite overlaps (those tests
run last). It starts with the first test outside tests/faults and tests/hostile, whose timings and Hypothesis
deadlines are kept off a busy core. The tests' own fixture then runs the same `grpo-deploy images build`, which reuses
it.

`make test` runs them only when their inputs changed since they last passed: images/cuda/arm64-verified.txt records
the hash of those inputs (every file the arm64 recipes read and the recipes themselves; the kit's Python code, which
the x86_64 images exercise in every run, is left out). `make test-arm64-images` runs them and rewrites that record;
`python -m tests.image_prebuild` says whether it is current."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

from grpo_deploy.image_build import places
from grpo_deploy.image_build.recipes import RECIPES as KIT_RECIPES

MARKER = "arm64_build"
RECIPES = ("cuda-server-arm64", "cuda-trainer-arm64")
_build: subprocess.Popen | None = None


def order_last(items: list) -> None:
    """Tests marked arm64_build after every other test (a stable sort: the rest keep their order)."""
    items.sort(key=lambda item: item.get_closest_marker(MARKER) is not None)


QUIET_DIRS = ("tests/faults/", "tests/hostile/")
_wanted = False


def remember(items: list) -> None:
    """Whether this session needs the arm64 images at all."""
    global _wanted
    _wanted = any(item.get_closest_marker(MARKER) for item in items)


def start_before(item) -> None:
    """Start the build before *item* unless it is in QUIET_DIRS (or it started already, or nothing needs it)."""
    if _wanted and _build is None and not item.nodeid.startswith(QUIET_DIRS):
        start()


def start() -> None:
    global _build
    log_dir = places.build_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "arm64-prebuild.log").open("a") as log:
        _build = subprocess.Popen([sys.executable, "-m", "grpo_deploy.cli", "images", "build", *RECIPES],
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait(timeout: float = 3600) -> None:
    """Until the background build ends (its outcome is the fixture's own build's to report)."""
    if _build is not None:
        _build.wait(timeout=timeout)


def stop() -> None:
    if _build is not None and _build.poll() is None:
        _build.terminate()
        try:
            _build.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _build.kill()


STAMP = Path(__file__).resolve().parents[1] / "images" / "cuda" / "arm64-verified.txt"
BASE_SCRIPT = "base.sh"


def inputs_key(images: Path | None = None) -> str:
    """sha256 over the arm64 recipes (their fields, args and platform) and every file they read, with its mode."""
    images = images or places.images_dir()
    digest = hashlib.sha256()
    for name in RECIPES:
        recipe = KIT_RECIPES[name]
        digest.update(repr(recipe).encode())
        files = {recipe.lock, BASE_SCRIPT, *recipe.deps_files, *(src for src, _, _ in recipe.code_files)}
        files |= {f for f in (recipe.deps_dockerfile, recipe.dockerfile, recipe.verify) if f}
        for rel in sorted(files):
            path = images / rel
            digest.update(f"{rel}\0{path.stat().st_mode & 0o777:o}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def recorded_key() -> str | None:
    try:
        for line in STAMP.read_text().splitlines():
            if line.startswith("inputs "):
                return line.split()[1]
    except OSError:
        return None
    return None


def unchanged() -> bool:
    """Whether the arm64 images' inputs are those they last passed with."""
    return recorded_key() == inputs_key()


def deselect_unchanged(config, items: list) -> str | None:
    """Deselect the arm64_build tests when their inputs are unchanged (GRPO_ARM64=always keeps them); the reason, to
    print, or None when nothing was deselected."""
    import os

    if os.environ.get("GRPO_ARM64") == "always" or not unchanged():
        return None
    chosen = [item for item in items if item.get_closest_marker(MARKER)]
    if not chosen:
        return None
    config.hook.pytest_deselected(items=chosen)
    items[:] = [item for item in items if not item.get_closest_marker(MARKER)]
    return (f"arm64 images: {len(chosen)} test(s) deselected, their inputs are unchanged since they passed "
            f"({STAMP.relative_to(STAMP.parents[2])}); `make test-arm64-images` runs them")


def record() -> None:
    """Rewrite the record after the arm64 tests passed (`make test-arm64-images` calls this)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=STAMP.parent).stdout.strip() or "unknown"
    STAMP.write_text("# The arm64 (DGX Spark) CUDA images passed their build and in-image checks with these inputs;\n"
                     "# `make test` skips rebuilding them under QEMU while the inputs hash the same. Written by\n"
                     "# `make test-arm64-images` (tests/image_prebuild.py); commit it with the change.\n"
                     f"inputs {inputs_key()}\nverified {time.strftime('%Y-%m-%d')} at {commit}\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--record"]:
        record()
        print(f"recorded {STAMP}")
    else:
        print("unchanged: `make test` deselects the arm64 image tests" if unchanged()
              else "changed (or never recorded): `make test` runs the arm64 image tests")
