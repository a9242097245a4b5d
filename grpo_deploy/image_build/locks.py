"""Lock files: parsing `name==version --hash=sha256:HEX` lines, matching them to wheels in a wheelhouse, and writing
them from pip's `--report` JSON. Pure functions, no Docker and no network."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

try:  # normalise versions the way pip does (pip's vendored packaging is always there beside pip)
    from pip._vendor.packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover
    Version, InvalidVersion = None, ValueError  # type: ignore[assignment,misc]

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*(?P<version>[^\s;#]+)(?P<rest>.*)$")
_HASH = re.compile(r"--hash=sha256:(?P<hex>[0-9a-fA-F]{64})")
_DIRECT = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*@\s*\S+")


class LockError(ValueError):
    """A lock line that is not a pin, or a pin without the wheel it names: says the file, line and what to do."""


def canonical(name: str) -> str:
    """PEP 503 project name: lower case, runs of -_. as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def norm_version(version: str) -> str:
    """The version as pip compares it (1.0 == 1.0.0 stays as written; 2.1.0a1 == 2.1.0.a1)."""
    if Version is None or not version:
        return version
    try:
        return str(Version(version))
    except InvalidVersion:
        return version


def public(version: str) -> str:
    """The version without its local segment: 2.11.0+cu130 -> 2.11.0."""
    return version.split("+", 1)[0]


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sha256: str | None
    line: str

    @property
    def key(self) -> str:
        return canonical(self.name)

    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def parse(text: str, where: str = "lock", strict: bool = True) -> list[Pin]:
    """The pins of a lock (comments and blank lines skipped). strict=False also reads `pip freeze` output, keeping
    `name @ URL` lines as a pin without a version and skipping other lines (`-e ...`)."""
    pins = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _PIN.match(line)
        if m is None:
            direct = _DIRECT.match(line)
            if not strict:
                if direct:
                    pins.append(Pin(direct.group("name"), "", None, line))
                continue
            raise LockError(f"{where}:{number}: {raw[:80]!r} is not a 'name==version [--hash=sha256:HEX]' line "
                            "(regenerate the lock with grpo-deploy images lock)")
        digest = _HASH.search(m.group("rest"))
        pins.append(Pin(m.group("name"), norm_version(m.group("version")),
                        digest.group("hex").lower() if digest else None, line))
    return pins


def read(path: Path, strict: bool = True) -> list[Pin]:
    return parse(path.read_text(), str(path), strict)


def version_of(pins: list[Pin], name: str) -> str:
    """The version the lock pins for *name*."""
    for pin in pins:
        if pin.key == canonical(name):
            return pin.version
    raise LockError(f"the lock pins no {name}: add it to the image's requirements and regenerate the lock")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_key(filename: str) -> tuple[str, str] | None:
    """(project, version) of a wheel file name, None when it is not one."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[: -len(".whl")].split("-")
    return (canonical(parts[0]), norm_version(parts[1])) if len(parts) >= 5 else None


def wheels_by_pin(directory: Path) -> dict[tuple[str, str], list[Path]]:
    index: dict[tuple[str, str], list[Path]] = {}
    for wheel in sorted(directory.glob("*.whl")) if directory.is_dir() else []:
        key = wheel_key(wheel.name)
        if key:
            index.setdefault(key, []).append(wheel)
    return index


def find_wheel(pin: Pin, index: dict[tuple[str, str], list[Path]], check_hash: bool = True) -> Path | None:
    """The wheel of *pin* in the index; with a hash in the pin, only a file with that sha256."""
    candidates = index.get((pin.key, pin.version), [])
    if pin.sha256 is None or not check_hash:
        return candidates[0] if candidates else None
    return next((c for c in candidates if sha256_file(c) == pin.sha256), None)


def missing(pins: list[Pin], directory: Path, check_hash: bool = True) -> list[Pin]:
    """The pins with no (matching) wheel in *directory*."""
    index = wheels_by_pin(directory)
    return [p for p in pins if find_wheel(p, index, check_hash) is None]


def select(pins: list[Pin], directory: Path, check_hash: bool = True) -> list[Path]:
    """The wheel file of every pin, hash-checked (unless not *check_hash*: wheels built here from a hash-checked
    source archive); LockError naming every pin that has none."""
    index = wheels_by_pin(directory)
    found, absent = [], []
    for pin in pins:
        wheel = find_wheel(pin, index, check_hash)
        (found.append(wheel) if wheel else absent.append(pin.spec()))
    if absent:
        raise LockError(f"{directory}: no wheel (or a hash mismatch) for {', '.join(absent[:8])}"
                        f"{' ...' if len(absent) > 8 else ''}: run grpo-deploy images wheelhouse")
    return found


def from_report(report: dict, exclude: set[str] = frozenset(), hashes: bool = True) -> list[str]:
    """Sorted lock lines from a `pip install --dry-run --report` JSON (projects in *exclude* left out)."""
    excluded = {canonical(n) for n in exclude}
    lines = []
    for item in report.get("install", []):
        meta = item["metadata"]
        name, version = canonical(meta["name"]), meta["version"]
        if name in excluded:
            continue
        line = f"{name}=={version}"
        if hashes:
            info = item.get("download_info", {})
            digest = info.get("archive_info", {}).get("hashes", {}).get("sha256")
            url = info.get("url", "")
            if not digest and url.startswith("file://"):
                digest = sha256_file(Path(unquote(urlparse(url).path)))
            if not digest:
                raise LockError(f"pip reported no sha256 for {name}=={version} ({url})")
            line += f" --hash=sha256:{digest}"
        lines.append(line)
    return sorted(lines)


def subtract(pins: list[Pin], base: list[Pin], keep_changed: bool = False) -> list[Pin]:
    """The pins whose project the base does not carry (with keep_changed: also those it carries at another public
    version) — what an image adds on top of its base."""
    have = {p.key: p.version for p in base}
    return [p for p in pins if p.key not in have
            or (keep_changed and have[p.key] and public(have[p.key]) != public(p.version))]


def reachable(report: dict, roots: list[str], stop: set[str]) -> set[str]:
    """The projects of a `pip install --dry-run --report` reachable from *roots* (requirement strings) through the
    installed items' requirements (markers evaluated, extras followed) without passing through a project in *stop*
    (what the base carries: its own dependencies are the base's business, e.g. a CUDA torch's nvidia-* wheels)."""
    from packaging.requirements import Requirement

    items = {canonical(i["metadata"]["name"]): i["metadata"] for i in report.get("install", [])}
    todo = [Requirement(r) for r in roots]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        if name in stop or name not in items:
            continue
        extras = set(req.extras)
        if name in seen and not extras:
            continue
        seen.add(name)
        for line in items[name].get("requires_dist") or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in (extras or {""})):
                todo.append(dep)
    return seen
