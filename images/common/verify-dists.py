#!/usr/bin/env python3
"""Build-time guard: fail the image build when installed distributions are not
what the image promises (its labels and the kit's version checks rely on them).

Usage: verify-dists.py [SPEC ...] [--pip-check] [--allow-missing N,...]
                       [--pip-check-scope LOCKFILE]

  NAME==VERSION   NAME is installed at VERSION (public version: a local
                  segment such as +cpu or +cu129 is ignored)
  !NAME           NAME is not installed and not importable
  --pip-check     run `pip check`; with --allow-missing, requirements on the
                  listed projects that are simply not installed are tolerated
                  (the cpu image leaves out torchvision/torchaudio/torchcodec
                  on purpose); with --pip-check-scope, only problems of the
                  projects pinned in LOCKFILE count (what this image added;
                  the base image's own pip check state is not ours to judge)
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import re
import subprocess
import sys


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    try:
        from packaging.version import Version
    except ImportError:
        return version.split("+", 1)[0]
    return Version(version).public


def check_pin(spec: str) -> str | None:
    name, _, wanted = spec.partition("==")
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        return f"{name} is not installed (wanted {wanted})"
    if public(found) != public(wanted):
        return f"{name} is {found}, wanted {wanted}"
    print(f"ok: {name} {found}")
    return None


def check_absent(name: str) -> str | None:
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        found = None
    module = name.replace("-", "_")
    if found or importlib.util.find_spec(module) is not None:
        return f"{name} must not be installed (found {found or 'an importable module'})"
    print(f"ok: {name} absent")
    return None


def pinned_names(lockfile: str) -> set[str]:
    names = set()
    with open(lockfile, encoding="utf-8") as handle:
        for line in handle:
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==", line)
            if match:
                names.add(canonical(match.group(1)))
    return names


def check_pip(allowed_missing: set[str], scope: set[str] | None = None) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    problems = []
    missing = re.compile(r"^\S+ \S+ requires (\S+), which is not installed\.$")
    for line in result.stdout.splitlines():
        if not line.strip() or line.startswith("No broken requirements"):
            continue
        match = missing.match(line.strip())
        if match and canonical(match.group(1)) in allowed_missing:
            continue
        requirer = line.split(" ", 1)[0]
        if scope is not None and canonical(requirer) not in scope:
            print(f"note (base image, not checked): {line.strip()}")
            continue
        problems.append(f"pip check: {line.strip()}")
    if result.returncode != 0 and not problems and not result.stdout.strip():
        problems.append(f"pip check failed: {result.stderr.strip()}")
    if not problems:
        print("ok: pip check" + (f" (tolerating missing {', '.join(sorted(allowed_missing))})"
                                 if allowed_missing else ""))
    return problems


def main(argv: list[str]) -> int:
    problems: list[str] = []
    allowed: set[str] = set()
    pip_check = False
    scope: set[str] | None = None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--pip-check":
            pip_check = True
        elif arg == "--pip-check-scope":
            scope = pinned_names(args.pop(0))
        elif arg == "--allow-missing":
            allowed |= {canonical(n) for n in args.pop(0).split(",") if n}
        elif arg.startswith("!"):
            problems.append(check_absent(arg[1:]))
        elif "==" in arg:
            problems.append(check_pin(arg))
        else:
            print(f"verify-dists.py: cannot read {arg!r}\n\n{__doc__}", file=sys.stderr)
            return 2
    if pip_check:
        problems.extend(check_pip(allowed, scope))
    problems = [p for p in problems if p]
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
