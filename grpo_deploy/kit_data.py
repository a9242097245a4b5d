"""Where the kit's files outside the Python modules are (compose/, images/): the copy an installed wheel ships in
grpo_deploy/kit/ (setup.py puts it there at build time), else the checkout this package is imported from (an editable
install). Nothing here writes; the kit's own build state goes under the user's cache dir
(grpo_deploy.image_build.places)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGED_DIR = PACKAGE_DIR / "kit"  # a wheel's copy of compose/ and images/
CHECKOUT_DIR = PACKAGE_DIR.parent  # the repository root when the package runs from a checkout
FOLDERS = ("compose", "images")  # what setup.py copies into the wheel


class KitDataMissing(RuntimeError):
    """The kit's data folder is in neither place: a broken install."""


def kit_dir(name: str, packaged: Path = PACKAGED_DIR, checkout: Path = CHECKOUT_DIR) -> Path:
    """The kit's *name* folder (compose, images): the installed package's copy when present, else the checkout's."""
    for root in (packaged, checkout):
        if (root / name).is_dir():
            return root / name
    raise KitDataMissing(f"the kit's {name}/ folder is in neither {packaged} (an installed wheel) nor {checkout} (a "
                         "checkout): reinstall grpo-deploy from its wheel, or install a checkout with pip install -e .")


def checkout_dir(checkout: Path = CHECKOUT_DIR) -> Path:
    """The checkout, for tools that rewrite its committed files; an installed wheel has none to rewrite."""
    if not (checkout / "pyproject.toml").is_file() or not all((checkout / name).is_dir() for name in FOLDERS):
        raise KitDataMissing(f"{checkout} is not a checkout of the kit (no pyproject.toml, compose/, images/): the "
                             "committed renders are rewritten in a checkout (make render-defaults)")
    return checkout
