"""Which CUDA image tests `make test` runs: those whose inputs changed since they last passed. Each architecture's
pair has a record, images/cuda/<arch>-verified.txt, holding the hash of its inputs — the recipes themselves and every
file they read (lock, Dockerfiles, base script, scripts copied in, the in-image check); the kit's Python code is left
out: the cpu image carries the same code and runs it in every CI run. While the hash matches, `make test` deselects
that architecture's tests and says so; `make test-cuda-images` (amd64) and `make test-arm64-images` run them and
rewrite the record. `python -m tests.image_records` says which are current; GRPO_IMAGE_TESTS=always keeps them all."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_deploy.image_build import places
from grpo_deploy.image_build.recipes import RECIPES

ROOT = Path(__file__).resolve().parents[1]
BASE_SCRIPT = "base.sh"


@dataclass(frozen=True)
class ImageTests:
    arch: str
    marker: str  # the pytest marker of the tests that need this pair
    recipes: tuple[str, ...]
    target: str  # the make target that runs them and writes the record

    @property
    def record(self) -> Path:
        return ROOT / "images" / "cuda" / f"{self.arch}-verified.txt"


PAIRS = (ImageTests("amd64", "amd64_build", ("cuda-server-amd64", "cuda-trainer-amd64", "cuda-verl-amd64"),
                    "make test-cuda-images"),
         ImageTests("arm64", "arm64_build", ("cuda-server-arm64", "cuda-trainer-arm64"), "make test-arm64-images"))
BY_ARCH = {p.arch: p for p in PAIRS}


def recipe_text(recipe) -> str:
    """The recipe's fields that differ from their defaults, as text: a field added to the table later (at its
    default) leaves every recorded image's key as it was."""
    set_fields = []
    for f in dataclasses.fields(recipe):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = getattr(recipe, f.name)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING or value != default:
            set_fields.append(f"{f.name}={value!r}")
    return f"{type(recipe).__name__}({', '.join(set_fields)})"


def inputs_key(pair: ImageTests, images: Path | None = None) -> str:
    """sha256 over the pair's recipes (their fields, args and platform) and every file they read, with its mode."""
    images = images or places.images_dir()
    digest = hashlib.sha256()
    for name in pair.recipes:
        recipe = RECIPES[name]
        digest.update(recipe_text(recipe).encode())
        files = {recipe.lock, BASE_SCRIPT, *recipe.deps_files, *(src for src, _, _ in recipe.code_files)}
        files |= {f for f in (recipe.deps_dockerfile, recipe.dockerfile, recipe.verify) if f}
        for rel in sorted(files):
            path = images / rel
            digest.update(f"{rel}\0{path.stat().st_mode & 0o777:o}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def recorded_key(pair: ImageTests) -> str | None:
    try:
        text = pair.record.read_text()[:4096]
    except OSError:
        return None
    return next((line.split()[1] for line in text.splitlines() if line.startswith("inputs ") and
                 len(line.split()) == 2), None)


def unchanged(pair: ImageTests) -> bool:
    return recorded_key(pair) == inputs_key(pair)


def deselect_unchanged(config, items: list) -> list[str]:
    """Deselect each pair's tests whose inputs are unchanged; one line per pair deselected, to print."""
    if os.environ.get("GRPO_IMAGE_TESTS") == "always":
        return []
    notes = []
    for pair in PAIRS:
        chosen = [item for item in items if item.get_closest_marker(pair.marker)]
        if not chosen or not unchanged(pair):
            continue
        config.hook.pytest_deselected(items=chosen)
        items[:] = [item for item in items if not item.get_closest_marker(pair.marker)]
        notes.append(f"{pair.arch} CUDA images: {len(chosen)} test(s) deselected, their inputs are unchanged since "
                     f"they passed ({pair.record.relative_to(ROOT)}); `{pair.target}` runs them")
    return notes


def record(pair: ImageTests) -> None:
    """Rewrite the pair's record after its tests passed (its make target calls this)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip() or "unknown"
    pair.record.write_text(f"# The {pair.arch} CUDA images passed their build and in-image checks with these inputs;\n"
                           "# `make test` deselects their tests while the inputs hash the same. Written by\n"
                           f"# `{pair.target}` (tests/image_records.py); commit it with the change.\n"
                           f"inputs {inputs_key(pair)}\nverified {time.strftime('%Y-%m-%d')} at {commit}\n")


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--record" and argv[1] in BY_ARCH:
        record(BY_ARCH[argv[1]])
        print(f"recorded {BY_ARCH[argv[1]].record}")
        return 0
    if argv:
        print(f"usage: python -m tests.image_records [--record {'|'.join(BY_ARCH)}]", file=sys.stderr)
        return 2
    for pair in PAIRS:
        state = "unchanged: `make test` deselects" if unchanged(pair) else "changed: `make test` runs"
        print(f"{pair.arch}: {state} its tests ({pair.target} runs them and records)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
