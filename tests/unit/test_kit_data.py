"""Where the kit's compose/ and images/ are found: an installed wheel's copy first, else the checkout; one clear error
when neither has them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from grpo_deploy import kit_data
from grpo_deploy.kit_data import KitDataMissing, checkout_dir, kit_dir

REPO = Path(__file__).resolve().parents[2]


def _folders(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
    return root


def test_the_packaged_copy_wins_over_a_checkout(tmp_path):
    packaged = _folders(tmp_path / "site" / "grpo_deploy" / "kit", "compose", "images")
    checkout = _folders(tmp_path / "repo", "compose", "images")
    assert kit_dir("compose", packaged, checkout) == packaged / "compose"
    assert kit_dir("images", packaged, checkout) == packaged / "images"


def test_a_checkout_serves_when_there_is_no_packaged_copy(tmp_path):
    checkout = _folders(tmp_path / "repo", "compose", "images")
    assert kit_dir("images", tmp_path / "no-kit", checkout) == checkout / "images"


def test_each_folder_is_looked_up_on_its_own(tmp_path):
    packaged = _folders(tmp_path / "kit", "compose")
    checkout = _folders(tmp_path / "repo", "images")
    assert kit_dir("compose", packaged, checkout) == packaged / "compose"
    assert kit_dir("images", packaged, checkout) == checkout / "images"


def test_neither_place_is_one_error_naming_both(tmp_path):
    packaged, checkout = tmp_path / "kit", _folders(tmp_path / "repo", "images")
    with pytest.raises(KitDataMissing) as exc:
        kit_dir("compose", packaged, checkout)
    message = str(exc.value)
    assert "\n" not in message and str(packaged) in message and str(checkout) in message


def test_the_source_tree_is_found_as_a_checkout_and_holds_no_packaged_copy():
    # The tests run from a checkout (editable install): the wheel build never writes kit/ into the source tree.
    root = kit_data.CHECKOUT_DIR
    assert not kit_data.PACKAGED_DIR.exists()
    assert kit_dir("compose") == root / "compose" and kit_dir("images") == root / "images"
    assert checkout_dir() == root


def test_checkout_dir_refuses_a_folder_that_is_not_a_checkout(tmp_path):
    site = _folders(tmp_path / "site-packages", "compose")  # a stray compose/ is not enough
    with pytest.raises(KitDataMissing):
        checkout_dir(site)
    (site / "images").mkdir()
    (site / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert checkout_dir(site) == site


def test_setup_copies_exactly_the_folders_the_package_looks_for():
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    (value,) = [ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["KIT_FOLDERS"]]
    assert value == kit_data.FOLDERS
