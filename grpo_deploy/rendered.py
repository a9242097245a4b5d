"""A render on disk: write one to a folder (the CLI, `up`, the committed defaults), compare a folder with one, and
read its KEY=VALUE env files back."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


class NotARenderError(Exception):
    """write_tree(replace=True) was pointed at a non-empty folder that no earlier render wrote."""


def write_tree(files: dict[str, str], out_dir: Path, *, replace: bool = False, clean: bool = False) -> list[Path]:
    """Write {relative path: text} under *out_dir*; the paths written, in the order of *files*.

    replace: *out_dir* becomes exactly *files*, swapped in whole (written to a sibling temporary folder, then
      renamed over it), so a failure leaves the earlier render intact. A non-empty *out_dir* without a MANIFEST
      (not an earlier render) is refused with NotARenderError and left untouched.
    clean: written in place, then every other file under *out_dir* is removed (and folders left empty). The
      folders themselves stay, so a container bind-mounting one of them keeps seeing it.
    neither: written in place; other files stay.
    """
    out_dir = Path(out_dir)
    if replace:
        if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / "MANIFEST").exists():
            raise NotARenderError(f"{out_dir} exists and is not an earlier render (no MANIFEST); "
                                  "choose an empty or new directory")
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        try:
            _write_files(files, tmp)
            if out_dir.exists():
                shutil.rmtree(out_dir)
            tmp.rename(out_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return [out_dir / rel for rel in files]
    written = _write_files(files, out_dir)
    if clean:
        for path in sorted(out_dir.rglob("*"), reverse=True):  # children before their folder
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):
                    path.rmdir()
            elif path.relative_to(out_dir).as_posix() not in files:
                path.unlink()
    return written


def _write_files(files: dict[str, str], out_dir: Path) -> list[Path]:
    written = []
    for rel, text in files.items():
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def diff_tree(files: dict[str, str], out_dir: Path) -> list[str]:
    """How *out_dir* differs from *files*: one line per path, "missing  rel", "differs  rel" or "extra    rel"."""
    out_dir = Path(out_dir)
    problems = []
    for rel, text in sorted(files.items()):
        target = out_dir / rel
        if not target.exists():
            problems.append(f"missing  {rel}")
        elif target.read_text(encoding="utf-8") != text:
            problems.append(f"differs  {rel}")
    if out_dir.exists():
        for path in sorted(out_dir.rglob("*")):
            rel = path.relative_to(out_dir).as_posix()
            if path.is_file() and rel not in files:
                problems.append(f"extra    {rel}")
    return problems


def parse_env(text: str) -> dict[str, str]:
    """A rendered KEY=VALUE env file as a dict: blank and `#` lines skipped, each other line split on its first `=`
    (nothing stripped or unquoted: the value is the rest of the line, as Docker's env files read it)."""
    env = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"line {number} is not KEY=VALUE: {line!r}")
        env[key] = value
    return env
