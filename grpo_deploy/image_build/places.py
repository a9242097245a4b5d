"""Where image builds read and write: the kit's images/ folder, the package baked into code images, and the build
state folder (logs, wheelhouses): build/ in a checkout, the user's cache dir for an installed wheel, or GRPO_BUILD_DIR.
Nothing is ever written into an installed package."""

from __future__ import annotations

import os
from pathlib import Path

from grpo_deploy.image_build.door import BadValue, checked_path
from grpo_deploy.kit_data import CHECKOUT_DIR, PACKAGE_DIR, kit_dir

BUILD_DIR_ENV = "GRPO_BUILD_DIR"


def images_dir() -> Path:
    return kit_dir("images")


def package_dir() -> Path:
    return PACKAGE_DIR


def in_checkout() -> bool:
    return images_dir().resolve() == (CHECKOUT_DIR / "images").resolve()


def build_dir(environ=os.environ) -> Path:
    """$GRPO_BUILD_DIR (checked like a flag), else build/ in a checkout, else
    ${XDG_CACHE_HOME:-~/.cache}/grpo-deploy/build."""
    given = environ.get(BUILD_DIR_ENV)
    if given is not None:
        try:
            return Path(checked_path(given))
        except BadValue as exc:
            raise BadValue(f"{BUILD_DIR_ENV}: {exc}") from None
    if in_checkout():
        return CHECKOUT_DIR / "build"
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "grpo-deploy" / "build"
