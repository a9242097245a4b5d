"""tests/image_records.py: a pair's inputs key follows every file its recipes read, and `make test` deselects a pair's
tests exactly while its record matches."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests import image_records
from tests.image_records import BY_ARCH

IMAGES = Path(__file__).resolve().parents[2] / "images"


def test_the_key_follows_each_file_and_its_mode(tmp_path):
    images = tmp_path / "images"
    shutil.copytree(IMAGES, images, symlinks=True)
    pair = BY_ARCH["arm64"]
    key = image_records.inputs_key(pair, images)
    assert key == image_records.inputs_key(pair, images)
    lock = images / "cuda" / "requirements-arm64.lock"
    lock.write_text(lock.read_text() + "\n# a comment is an input too\n")
    assert image_records.inputs_key(pair, images) != key
    changed = image_records.inputs_key(pair, images)
    (images / "base.sh").chmod(0o600)
    assert image_records.inputs_key(pair, images) != changed
    assert image_records.inputs_key(BY_ARCH["amd64"], images) != image_records.inputs_key(pair, images)


class _Item:
    def __init__(self, marker: str | None):
        self.marker = marker

    def get_closest_marker(self, name):
        return name if name == self.marker else None


class _Config:
    def __init__(self):
        self.deselected = []
        self.hook = self

    def pytest_deselected(self, items):
        self.deselected += items


def test_deselected_while_the_record_matches_and_kept_once_it_does_not(monkeypatch, tmp_path):
    pair = BY_ARCH["amd64"]
    monkeypatch.setattr(image_records.ImageTests, "record", property(lambda self: tmp_path / f"{self.arch}.txt"))
    monkeypatch.delenv("GRPO_IMAGE_TESTS", raising=False)
    monkeypatch.setattr(image_records, "ROOT", tmp_path)
    items = [_Item("amd64_build"), _Item(None), _Item("arm64_build")]
    assert image_records.deselect_unchanged(_Config(), list(items)) == [], "no record: every test runs"
    image_records.record(pair)
    config, kept = _Config(), list(items)
    (note,) = image_records.deselect_unchanged(config, kept)
    assert config.deselected == [items[0]] and kept == items[1:] and "amd64 CUDA images: 1 test(s)" in note
    monkeypatch.setenv("GRPO_IMAGE_TESTS", "always")
    assert image_records.deselect_unchanged(_Config(), list(items)) == []
    monkeypatch.delenv("GRPO_IMAGE_TESTS")
    pair.record.write_text(pair.record.read_text().replace("inputs ", "inputs 0"))
    assert image_records.deselect_unchanged(_Config(), list(items)) == [], "a stale record: the tests run"


def test_a_field_at_its_default_does_not_enter_the_key():
    import dataclasses

    from grpo_deploy.image_build.recipes import RECIPES
    from tests.image_records import recipe_text

    recipe = RECIPES["cuda-server-amd64"]
    assert "base_recipe" not in recipe_text(recipe) and "lock=" in recipe_text(recipe)
    assert recipe_text(dataclasses.replace(recipe, base_recipe="cpu")) != recipe_text(recipe)
