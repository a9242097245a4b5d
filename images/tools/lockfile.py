#!/usr/bin/env python3
"""Small helper for images/build.sh: lock files and wheelhouses.

A lock file here is one requirement per line, ``name==version`` optionally
followed by ``--hash=sha256:HEX`` (pip's own requirement syntax, so the file is
fed to ``pip install --require-hashes -r`` unchanged). Comment lines start
with ``#``.

Subcommands (all print to stdout, errors to stderr, exit 1 on failure):

  freeze REPORT [--exclude N,...] [--hashes]
      turn a ``pip install --dry-run --report`` JSON into lock lines
  missing LOCK DIR
      print the lock entries that have no matching wheel in DIR
  select LOCK DIR
      print the wheel file of every lock entry (fails if one is missing)
  subtract LOCK BASE [--keep-changed]
      print the entries of LOCK whose project is not named in BASE
      (BASE: a lock file or a ``pip freeze`` listing); with --keep-changed
      also those BASE carries at another version
  version LOCK NAME
      print the version LOCK pins for NAME

Only the standard library is used, plus pip's vendored ``packaging`` for
version normalisation when available, so it runs with any host Python >= 3.8.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

try:  # normalise versions the way pip does; plain strings otherwise
    from pip._vendor.packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - pip is always there in practice
    Version = None  # type: ignore[assignment]
    InvalidVersion = ValueError  # type: ignore[assignment,misc]

_LINE = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*(?P<version>[^\s;#]+)"
    r"(?P<rest>.*)$"
)
_HASH = re.compile(r"--hash=sha256:(?P<hex>[0-9a-fA-F]{64})")


def canonical(name: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """The version without its local segment (2.11.0+cu130 -> 2.11.0)."""
    return version.split("+", 1)[0]


def norm_version(version: str) -> str:
    if Version is None:
        return version
    try:
        return str(Version(version))
    except InvalidVersion:
        return version


class Entry:
    def __init__(self, name: str, version: str, sha256: str | None, line: str) -> None:
        self.name = name
        self.key = canonical(name)
        self.version = norm_version(version)
        self.sha256 = sha256.lower() if sha256 else None
        self.line = line

    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def read_lock(path: Path, strict: bool = True) -> list[Entry]:
    """Parse a lock file; with strict=False skip lines that are not pins
    (``pip freeze`` also prints ``name @ URL`` and ``-e`` lines)."""
    entries = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match and not strict:
            # `pip freeze` writes "name @ URL" for packages installed from a
            # file: the project is there, its version is not stated.
            direct = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*@\s*\S+", line)
            if direct:
                entries.append(Entry(direct.group(1), "", None, line))
            continue
        if not match:
            sys.exit(f"{path}:{number}: not a 'name==version' line: {raw!r}")
        digest = _HASH.search(match.group("rest"))
        entries.append(
            Entry(match.group("name"), match.group("version"),
                  digest.group("hex") if digest else None, line)
        )
    return entries


def wheel_index(directory: Path) -> dict[tuple[str, str], list[Path]]:
    """Map (project, version) to the wheel files in DIRECTORY."""
    index: dict[tuple[str, str], list[Path]] = {}
    for wheel in sorted(directory.glob("*.whl")):
        parts = wheel.name[: -len(".whl")].split("-")
        if len(parts) < 5:
            continue
        key = (canonical(parts[0]), norm_version(parts[1]))
        index.setdefault(key, []).append(wheel)
    return index


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_wheel(entry: Entry, index: dict[tuple[str, str], list[Path]]) -> Path | None:
    candidates = index.get((entry.key, entry.version), [])
    if entry.sha256 is None:
        return candidates[0] if candidates else None
    for candidate in candidates:
        if sha256_of(candidate) == entry.sha256:
            return candidate
    return None


def cmd_freeze(args: argparse.Namespace) -> int:
    report = json.loads(Path(args.report).read_text())
    excluded = {canonical(n) for n in args.exclude.split(",") if n}
    lines = []
    for item in report.get("install", []):
        meta = item["metadata"]
        name, version = meta["name"], meta["version"]
        if canonical(name) in excluded:
            continue
        line = f"{canonical(name)}=={version}"
        if args.hashes:
            info = item.get("download_info", {})
            hashes = info.get("archive_info", {}).get("hashes", {})
            digest = hashes.get("sha256")
            url = info.get("url", "")
            if not digest and url.startswith("file://"):
                digest = sha256_of(Path(unquote(urlparse(url).path)))
            if not digest:
                sys.exit(f"no sha256 known for {name}=={version} ({url})")
            line += f" --hash=sha256:{digest}"
        lines.append(line)
    print("\n".join(sorted(lines)))
    return 0


def cmd_missing(args: argparse.Namespace) -> int:
    index = wheel_index(Path(args.dir)) if Path(args.dir).is_dir() else {}
    for entry in read_lock(Path(args.lock)):
        if find_wheel(entry, index) is None:
            print(entry.line)
    return 0


def cmd_select(args: argparse.Namespace) -> int:
    index = wheel_index(Path(args.dir))
    missing = []
    for entry in read_lock(Path(args.lock)):
        wheel = find_wheel(entry, index)
        if wheel is None:
            missing.append(entry.spec())
        else:
            print(wheel)
    if missing:
        sys.exit(f"{args.dir}: no wheel (or a hash mismatch) for: {', '.join(missing)}")
    return 0


def cmd_subtract(args: argparse.Namespace) -> int:
    base = {entry.key: entry.version for entry in read_lock(Path(args.base), strict=False)}
    for entry in read_lock(Path(args.lock)):
        if entry.key not in base:
            print(entry.line)
        elif args.keep_changed and base[entry.key] and public(base[entry.key]) != public(entry.version):
            print(entry.line)
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    wanted = canonical(args.name)
    for entry in read_lock(Path(args.lock)):
        if entry.key == wanted:
            print(entry.version)
            return 0
    sys.exit(f"{args.lock}: no pin for {args.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    freeze = sub.add_parser("freeze")
    freeze.add_argument("report")
    freeze.add_argument("--exclude", default="")
    freeze.add_argument("--hashes", action="store_true")
    freeze.set_defaults(func=cmd_freeze)

    for name, func in (("missing", cmd_missing), ("select", cmd_select)):
        command = sub.add_parser(name)
        command.add_argument("lock")
        command.add_argument("dir")
        command.set_defaults(func=func)

    subtract = sub.add_parser("subtract")
    subtract.add_argument("lock")
    subtract.add_argument("base")
    subtract.add_argument("--keep-changed", action="store_true",
                          help="also keep pins whose version differs from BASE")
    subtract.set_defaults(func=cmd_subtract)

    version = sub.add_parser("version")
    version.add_argument("lock")
    version.add_argument("name")
    version.set_defaults(func=cmd_version)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
