"""The documentation site holds: the committed reference pages are what the generator writes, `mkdocs build --strict`
passes (no broken internal link, every page in the nav or excluded), and the README stays a landing page whose
links resolve and which keeps the two set-up commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_deploy import docs_reference

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 220


def test_committed_reference_pages_match_the_generator():
    stale = [name for name, text in docs_reference.pages().items()
             if (ROOT / "docs" / "reference" / name).read_text(encoding="utf-8") != text]
    assert not stale, f"docs/reference/{stale} differ: run python -m grpo_deploy.docs_reference and commit"


def test_mkdocs_build_strict(tmp_path):
    # No -q: it hides the warnings that --strict counts. A missing mkdocs skips here, and a skip fails the run under
    # GRPO_NO_SKIPS=1 (tests/conftest.py), as in CI.
    pytest.importorskip("mkdocs", reason="mkdocs not installed: pip install -e '.[test]'")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "spec" / "index.html").is_file()


def test_every_markdown_page_is_in_the_nav_or_excluded():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    excluded = ("notes/", "bench/")
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    missing = [p for p in pages if not p.startswith(excluded) and f": {p}\n" not in config]
    assert not missing, f"pages in docs/ that are not in mkdocs.yml's nav: {missing}"


def test_readme_is_a_landing_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make demo    #" in text and "make test    #" in text  # the two commands CI runs (.ci/run)
    assert not re.search(r"\bissue \d+|\b[0-9a-f]{7,40}\b", text), "no issue numbers or commit hashes in the README"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
