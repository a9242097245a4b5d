"""The arm64 CUDA images, started in the background as soon as a session has selected a test that needs them: under
QEMU user emulation their dependency image takes about 15 minutes of one core, which the rest of the suite overlaps
(those tests run last). The tests' own fixture then runs the same `grpo-deploy images build`, which reuses it."""

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


def start(items: list) -> None:
    global _build
    if _build is not None or not any(item.get_closest_marker(MARKER) for item in items):
        return
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
