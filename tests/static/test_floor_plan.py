"""The floor plan holds: no module over 470 lines; the shared base (common/) imports nothing else of the kit;
runtime/ (what runs in the containers) imports only runtime/ and common/; runtime's rooms import each other in one
direction only; every module path that a file outside the package's code names (compose, k8s, Dockerfiles,
entrypoint scripts, templates, pyproject, Makefile, the docs) is a module, or a name in one, that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.static.test_imports import cycles, graph

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "grpo_deploy"
MAX_LINES = 470
# Files that name the package's modules as text. Historical records (docs/bench, docs/notes, MEASUREMENTS, CHANGELOG)
# keep the paths of their day.
NAMED_IN = ("compose/**/*", "k8s/**/*", "images/**/*", "grpo_deploy/templates/**/*", "ansible/**/*", "pyproject.toml",
            "Makefile", "setup.py", ".ci/*", "scripts/**/*", "README.md", "docs/*.md", "docs/guides/*.md",
            "docs/operations/*.md", "docs/reference/*.md", "mkdocs.yml", "benchmarks/**/*")
HISTORICAL = ("docs/MEASUREMENTS.md",)
DOTTED = re.compile(r"(?<![\w./-])grpo_deploy(?:\.\w+)+(?::\w+)?")
SLASHED = re.compile(r"(?<![\w./-])grpo_deploy(?:/\w+)+\.py\b")


def _room(module: str) -> str:
    """The room of a grpo_deploy module: its folder under the package; in runtime/, each subfolder and each module
    beside them (health, identity, tiny_model, netprobe) is a room of its own."""
    parts = module.split(".")
    return ".".join(parts[:3] if parts[1:2] == ["runtime"] else parts[:2])


def _defined(path: Path) -> set[str]:
    """The names a module defines or imports at its top level (what `module.name` may name)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def resolves(reference: str, root: Path = ROOT) -> bool:
    """Whether `grpo_deploy.a.b[.name][:attr]` names a module of the checkout (and a name defined in it)."""
    dotted, _, attr = reference.partition(":")
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not path.is_file():
            continue
        rest = parts[i:] + ([attr] if attr else [])
        if not rest:
            return True
        if (base / rest[0]).with_suffix(".py").is_file() or (base / rest[0] / "__init__.py").is_file():
            return False  # a module below that the loop would have found
        return rest[0] in _defined(path)
    return False


def named_references(root: Path = ROOT) -> list[tuple[str, str]]:
    out = []
    for pattern in NAMED_IN:
        for path in sorted(root.glob(pattern)):
            rel = str(path.relative_to(root))
            if not path.is_file() or path.is_symlink() or rel in HISTORICAL or "__pycache__" in rel \
                    or "/generated/" in rel and rel.endswith(".json"):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for n, line in enumerate(text.splitlines(), 1):
                out += [(f"{rel}:{n}", m.group(0)) for m in DOTTED.finditer(line)]
                out += [(f"{rel}:{n}", m.group(0)) for m in SLASHED.finditer(line)]
    return out


def test_no_module_over_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (cut them along a seam): {long}"


def test_the_shared_base_imports_nothing_else_of_the_kit():
    edges = graph()
    wrong = {m: sorted(t for t in to if not t.startswith("grpo_deploy.common") and t != "grpo_deploy")
             for m, to in edges.items() if m.startswith("grpo_deploy.common")}
    assert not {m: t for m, t in wrong.items() if t}, wrong


def test_the_runtime_imports_only_the_runtime_and_the_shared_base():
    edges = graph()
    allowed = ("grpo_deploy.runtime", "grpo_deploy.common")
    wrong = {m: sorted(t for t in to if not t.startswith(allowed) and t != "grpo_deploy")
             for m, to in edges.items() if m.startswith("grpo_deploy.runtime")}
    assert not {m: t for m, t in wrong.items() if t}, {m: t for m, t in wrong.items() if t}


def test_the_runtime_rooms_import_each_other_in_one_direction_only():
    rooms: dict[str, set[str]] = {}
    for module, to in graph().items():
        if module.startswith("grpo_deploy.runtime."):
            rooms.setdefault(_room(module), set()).update(
                _room(t) for t in to if t.startswith("grpo_deploy.runtime.") and _room(t) != _room(module))
    for room in list(rooms):
        for target in rooms[room]:
            rooms.setdefault(target, set())
    assert not cycles(rooms), f"runtime rooms that import each other: {sorted(sorted(c) for c in cycles(rooms))}"


def test_every_module_named_outside_the_code_exists():
    refs = named_references()
    assert len(refs) > 40, "the scan found too few references: its patterns no longer match the files"
    bad = [f"{where}: {ref}" for where, ref in refs
           if not (ROOT / ref).is_file() if "/" in ref] + \
          [f"{where}: {ref}" for where, ref in refs if "/" not in ref and not resolves(ref)]
    assert not bad, "names of modules that do not exist (follow the move):\n" + "\n".join(bad)


def test_the_checker_refuses_a_moved_module(tmp_path):
    (tmp_path / "grpo_deploy" / "runtime" / "trainer").mkdir(parents=True)
    for rel in ("grpo_deploy/__init__.py", "grpo_deploy/runtime/__init__.py",
                "grpo_deploy/runtime/trainer/__init__.py"):
        (tmp_path / rel).write_text("")
    (tmp_path / "grpo_deploy/runtime/trainer/train.py").write_text("def main():\n    pass\n")
    assert resolves("grpo_deploy.runtime.trainer.train", tmp_path)
    assert resolves("grpo_deploy.runtime.trainer.train:main", tmp_path)
    assert resolves("grpo_deploy.runtime.trainer.train.main", tmp_path)
    assert not resolves("grpo_deploy.runtime.train", tmp_path)  # the old path
    assert not resolves("grpo_deploy.runtime.trainer.train:run", tmp_path)
    assert not resolves("grpo_deploy.runtime.trainer.serve", tmp_path)


# Modules without a test file of their name, each with the reason (tests/unit mirrors the package: grpo_deploy/a/b.py
# is tested in tests/unit/a/test_b.py; a package's __init__.py with code in tests/unit/a/test_a.py).
# Unit test files that are named after no module, each with what it tests.
TESTS_OF_SEVERAL: dict[str, str] = {
    "tests/unit/image_build/test_cuda_recipes.py": "the CUDA entries of image_build.recipes: their lock (locks, "
                                                   "lockgen), deps key (build), tags and served wheelhouse",
    "tests/unit/render/test_render_output.py": "`render -o DIR` end to end: cli over render.folder's refusals",
    "tests/unit/test_arm64_switches.py": "tests/arm64_switches.py, a helper of the test suite (not a package module)",
    "tests/unit/test_image_records.py": "tests/image_records.py, a helper of the test suite (not a package module)",
    "tests/unit/test_ci_phases.py": "tests/ci_phases.py, a helper of the test suite (not a package module)",
    "tests/unit/runtime/storage/test_checkpoints_verl.py": "verl checkpoints across a resume, on one save history: "
                                                           "storage/resume.py (verl_resume) and storage/checkpoints.py "
                                                           "(prune, the tracker); its helpers serve verl/test_node.py",
}
UNTESTED_BY_NAME: dict[str, str] = {
    "grpo_deploy/__init__.py": "the version string only",
    "grpo_deploy/deploy/images.py": "builds images on a Docker engine: `up` runs it in "
                                    "tests/integration/test_rehearsal.py",
    "grpo_deploy/hostchecks/conftest.py": "pytest glue of the host checks: run by tests/unit/hostchecks/test_runner.py",
    "grpo_deploy/hostchecks/plugin.py": "the host checks' pytest options: run by tests/unit/hostchecks/test_runner.py",
    "grpo_deploy/hostchecks/test_host.py": "testinfra checks users run against hosts: run by "
                                           "tests/unit/hostchecks/test_runner.py and test_hostchecks_remote.py",
    "grpo_deploy/hostchecks/test_run.py": "testinfra checks of a running run: run by "
                                          "tests/unit/hostchecks/test_runner.py and test_hostchecks_remote.py",
}


def _test_file_of(path: Path) -> Path | None:
    """The test file a module's tests live in; None for a package face that only re-exports."""
    rel = path.relative_to(PACKAGE)
    if path.name != "__init__.py":
        return ROOT.joinpath("tests", "unit", *rel.parent.parts, f"test_{path.stem}.py")
    body = [n for n in ast.parse(path.read_text(encoding="utf-8")).body
            if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in body) or not rel.parent.parts:
        return None
    return ROOT.joinpath("tests", "unit", *rel.parent.parts, f"test_{rel.parent.name}.py")


def test_every_module_has_a_test_file_of_its_name():
    missing = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts
                     and (t := _test_file_of(p)) is not None and not t.is_file()
                     and str(p.relative_to(ROOT)) not in UNTESTED_BY_NAME)
    assert not missing, "modules without tests/unit/<room>/test_<module>.py (write one, or say why in " \
                        "UNTESTED_BY_NAME):\n" + "\n".join(missing)
    stale = sorted(m for m in UNTESTED_BY_NAME if not (ROOT / m).is_file() or _test_file_of(ROOT / m) is not None
                   and _test_file_of(ROOT / m).is_file())
    assert not stale, f"UNTESTED_BY_NAME entries that now have a test file or no module: {stale}"


def test_every_unit_test_file_is_named_after_a_module():
    modules = {t for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts and (t := _test_file_of(p))}
    orphans = sorted(str(t.relative_to(ROOT)) for t in ROOT.glob("tests/unit/**/test_*.py")
                     if t not in modules and str(t.relative_to(ROOT)) not in TESTS_OF_SEVERAL)
    assert not orphans, "unit test files named after no module (rename to the module they test, or say why in " \
                        "TESTS_OF_SEVERAL):\n" + "\n".join(orphans)
