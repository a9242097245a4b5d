"""verl's `verl.plugins` entry point (runtime/verl/cpu_plugin.py): pyproject names it, and where registering fails
the import still succeeds and says why in one line on stderr (verl would hide it at debug level). Each import runs in
a fresh interpreter: importing is the work. That it registers the CPU platform is checked where verl is installed:
the verl-cpu image's build asserts it, and the verl runs of tests/integration and tests/faults train on it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
MODULE = "grpo_deploy.runtime.verl.cpu_plugin"


def _import(prelude: str = "", then: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", f"{prelude}\nimport {MODULE}\n{then}"], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_pyproject_names_it_as_verls_plugin():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["verl.plugins"] == {"grpo-deploy-cpu": MODULE}


def test_a_failed_registration_is_one_line_on_stderr_not_a_failed_import():
    done = _import("import sys; sys.modules['verl'] = None  # verl absent")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grpo-deploy: the verl CPU platform was not registered: "), lines
    assert "ModuleNotFoundError" in lines[0] and "Traceback" not in done.stderr
