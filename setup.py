"""Build hook: the wheel ships the kit's compose/ and images/ folders as grpo_deploy/kit/ (grpo_deploy.kit_data finds
them there). They are copied into the build tree only; the repository keeps them at its top level, and an editable
install reads them from the checkout. Everything else is in pyproject.toml."""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

KIT_FOLDERS = ("compose", "images")  # grpo_deploy.kit_data.FOLDERS
SKIPPED = ("__pycache__", ".pyc")


class BuildPyWithKit(build_py):
    """build_py, then compose/ and images/ copied into <build_lib>/grpo_deploy/kit/ (modes kept)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's folders
        for folder in KIT_FOLDERS:
            for src in self._kit_files(folder):
                dst = os.path.join(self.build_lib, "grpo_deploy", "kit", src)
                self.mkpath(os.path.dirname(dst))
                self.copy_file(src, dst, preserve_mode=True)

    @staticmethod
    def _kit_files(folder: str) -> list[str]:
        if not os.path.isdir(folder):
            raise SystemExit(f"error: {folder}/ is missing: build the wheel from a checkout of the kit")
        found = []
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
            found += [os.path.join(root, f) for f in sorted(files) if not f.endswith(SKIPPED)]
        return found


setup(cmdclass={"build_py": BuildPyWithKit})
