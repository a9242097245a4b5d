"""The engine boundary: the deployer finds an engine's bring-up by an explicit table (no importlib in deploy/), and
outside the engine rooms (engines/, diagnose, deploy/bringup/, runtime/) no module names an engine in a string
literal: it asks the engine (grpo_deploy.engines.Engine) instead."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_deploy"
ENGINE_WORDS = ("trl-async", "verl")
ENGINE_ROOMS = ("engines/", "diagnose.py", "diagnose_verl.py", "diagnose/", "deploy/bringup/", "runtime/")
"""Where an engine's own code lives (paths relative to grpo_deploy/)."""
IMAGE_ROOMS = ("image_build/",)
"""Modules that name images; an image is named after the engine it runs (`verl`, grpo-deploy/verl-cpu)."""
ALLOWED: dict[tuple[str, str], str] = {
    # the settings section an engine reads is named after it (overrides.verl): a section, not an engine choice
    ("settings.py", "verl"): "OWNED's section key",
}
"""(module, word) -> why it may name the engine; keep it tiny."""


def engine_literals(source: str) -> list[tuple[int, str]]:
    """(line, word) of each string literal of *source* that is exactly an engine's name."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and node.value in ENGINE_WORDS]


def leaks(package: Path = PACKAGE) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith(ENGINE_ROOMS + IMAGE_ROOMS):
            continue
        out += [f"grpo_deploy/{rel}:{line}: {word!r}" for line, word in engine_literals(path.read_text("utf-8"))
                if (rel, word) not in ALLOWED]
    return out


def test_no_importlib_in_the_deployer():
    hits = [f"{path.relative_to(PACKAGE.parent)}:{n}" for path in sorted((PACKAGE / "deploy").rglob("*.py"))
            for n, line in enumerate(path.read_text("utf-8").splitlines(), 1) if "importlib" in line]
    assert not hits, f"the bring-up is found by grpo_deploy.deploy.bringup.BRINGUP, not by a module string: {hits}"


def test_no_engine_name_outside_the_engine_rooms():
    found = leaks()
    assert not found, ("an engine named outside engines/, diagnose, deploy/bringup/ and runtime/: give the engine a "
                       f"property and ask it (res.engine_info) instead: {found}")


def test_the_finder_sees_an_engine_test(tmp_path):
    (tmp_path / "plan.py").write_text('def f(res):\n    if res.engine == "verl":\n        return 1\n')
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "verl.py").write_text('NAME = "verl"\n')
    (tmp_path / "images.py").write_text('IMAGE = "grpo-deploy/verl-cpu"\n')
    assert leaks(tmp_path) == [f"grpo_deploy/plan.py:2: {'verl'!r}"]


def test_the_allowlist_names_only_what_is_there():
    for (module, word), why in ALLOWED.items():
        assert why and (module, word) in {(module, w) for _, w in engine_literals((PACKAGE / module).read_text())}, \
            f"{module} no longer names {word!r}: remove it from ALLOWED"
