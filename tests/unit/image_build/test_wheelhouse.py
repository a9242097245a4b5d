"""grpo_deploy.image_build.wheelhouse: a real `pip download` (this host's pip configuration and index) of a small lock
for the cpu image's platform; only what is missing is fetched, and a wrong hash fails the step."""

from __future__ import annotations

import io
import re
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from grpo_deploy.image_build import locks, progress, wheelhouse
from grpo_deploy.image_build.recipes import RECIPES

IMAGES = Path(__file__).resolve().parents[3] / "images"
SMALL = ("idna", "packaging")  # two small pure-Python wheels of the cpu lock


@pytest.fixture()
def small_kit(tmp_path: Path) -> tuple:
    pins = [p for p in locks.read(IMAGES / "cpu" / "requirements.lock") if p.key in SMALL]
    assert len(pins) == 2
    images = tmp_path / "images"
    (images / "cpu").mkdir(parents=True)
    (images / "cpu" / "requirements.lock").write_text("# two pins\n" + "".join(p.line + "\n" for p in pins))
    return images, replace(RECIPES["cpu"], name="small"), pins


def test_ensure_downloads_the_missing_pins_then_does_nothing(small_kit, tmp_path: Path, capsys):
    images, recipe, pins = small_kit
    wheels, logs = tmp_path / "wh", tmp_path / "logs"
    wheels.mkdir()
    (wheels / "unrelated.txt").write_text("kept")
    wheelhouse.ensure(recipe, images, wheels, logs)
    assert locks.missing(pins, wheels) == [] and (wheels / "unrelated.txt").read_text() == "kept"
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "wheelhouse small: 2 wheels in" in err
    assert re.search(r"Saved .*/idna-.*\.whl", (logs / "wheelhouse-small.log").read_text())
    wheelhouse.ensure(recipe, images, wheels, logs)  # nothing missing: no step, no output
    assert capsys.readouterr().err == ""


def test_a_hash_mismatch_fails_with_the_log_tail(small_kit, tmp_path: Path, capsys):
    images, recipe, pins = small_kit
    lock = images / "cpu" / "requirements.lock"
    lock.write_text(re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, lock.read_text(), count=1))
    with pytest.raises(progress.StepFailed, match="pip download exited"):
        wheelhouse.ensure(recipe, images, tmp_path / "wh", tmp_path / "logs")
    err = capsys.readouterr().err
    assert "--- last lines of" in err and "HASH" in err.upper() and "full log:" in err


def test_download_args_name_the_platform_not_the_host():
    argv = wheelhouse.download_args(RECIPES["trainer-arm64"], Path("r.txt"), Path("d"))
    assert "manylinux_2_35_aarch64" in argv and argv[argv.index("--python-version") + 1] == "3.12"
    assert "--no-deps" in argv and argv[-4:] == ["-d", "d", "-r", "r.txt"]


def test_run_logged_captures_output_in_the_log(tmp_path: Path):
    with progress.Step("x", tmp_path / "x.log", io.StringIO()) as step:
        code = wheelhouse.run_logged(["sh", "-c", "echo out; echo err >&2; exit 3"], step)
    assert code == 3 and "out\nerr\n" in (tmp_path / "x.log").read_text()
    assert shutil.which("sh")


def test_prefetched_downloads_beside_the_block_and_raises_its_failure(monkeypatch, tmp_path):
    seen = {}

    def slow_ensure(recipe, images, directory, log_dir, lines_only=False):
        seen.update(thread=threading.current_thread().name, lines_only=lines_only)
        time.sleep(0.5)

    monkeypatch.setattr(wheelhouse, "ensure", slow_ensure)
    start = time.monotonic()
    with wheelhouse.prefetched(RECIPES["cpu"], tmp_path, tmp_path / "w", tmp_path):
        time.sleep(0.5)  # the base image's build, meanwhile
    assert time.monotonic() - start < 0.9, "the two ran one after the other"
    assert seen == {"thread": "wheelhouse-cpu", "lines_only": True}

    def failing(*args, **kwargs):
        raise progress.StepFailed("pip download failed (exit 1)")

    monkeypatch.setattr(wheelhouse, "ensure", failing)
    with pytest.raises(progress.StepFailed, match="pip download failed"):
        with wheelhouse.prefetched(RECIPES["cpu"], tmp_path, tmp_path / "w", tmp_path):
            pass
