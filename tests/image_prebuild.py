"""The arm64 CUDA images, built in the background when a session has selected a test that needs them: under QEMU user
emulation their dependency image takes about 15 minutes of one core, which the rest of the suite overlaps (those tests
run last). It starts with the first test outside tests/faults and tests/hostile, whose timings and Hypothesis
deadlines are kept off a busy core. The tests' own fixture then runs the same `grpo-deploy images build`, which reuses
it. (Whether `make test` selects them at all: tests/image_records.py.)"""

from __future__ import annotations

import subprocess
import sys

from grpo_deploy.image_build import places

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

