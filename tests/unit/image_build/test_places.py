"""Tests of grpo_deploy.image_build.places: where builds write (GRPO_BUILD_DIR checked like a flag, else build/ in a
checkout) and read (the kit's images/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_deploy.image_build import door, places

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("value", ["a\nb", "a\x85b", "a\u2028b", "$HOME/x", "-x", "../up"])
def test_a_hostile_build_dir_in_the_environment_is_refused(value: str):
    with pytest.raises(door.BadValue, match=r"^GRPO_BUILD_DIR: .* is not a usable path"):
        places.build_dir({"GRPO_BUILD_DIR": value})


def test_build_dir_defaults(tmp_path: Path):
    assert places.build_dir({}) == REPO / "build"
    assert places.build_dir({"GRPO_BUILD_DIR": str(tmp_path)}) == tmp_path


def test_a_checkout_reads_its_own_images_folder():
    assert places.images_dir().resolve() == (REPO / "images").resolve() and places.in_checkout()
    assert (places.package_dir() / "__init__.py").is_file()


def test_without_a_checkout_build_dir_follows_the_cache_home(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(places, "in_checkout", lambda: False)
    assert places.build_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "grpo-deploy" / "build"
    assert places.build_dir({"GRPO_BUILD_DIR": "b"}) == Path("b")  # the variable wins anywhere
