"""Helpers of the hostile-input suite: specs from `grpo-deploy init` with one value replaced (any key, any type),
the CLI run in-process with its output captured, the shape of a refusal, and a small reader of Hydra overrides."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from grpo_deploy.cli import main
from grpo_deploy.spec import key_str
from tests.specs import spec_data

# The init specs the suite starts from: (profile, engine, --hosts).
BASES = {
    "cpu": ("cpu", "trl-async", ()),
    "gb10-pair": ("gb10", "trl-async", ("spark1", "spark2")),
    "h200": ("h200", "trl-async", ()),
    "h100": ("h100", "trl-async", ()),  # one GPU for both roles
    "a100-verl": ("a100", "verl", ()),
}
SPEC_NAME = "spec.yaml"
# Text an injection tries to make a line of its own; no render of a valid spec has a line starting with one.
PAYLOADS = ("COMPOSE_FILE=evil", "--trust-remote-code", "HF_TOKEN=stolen", "INJECTED=1", "trainer.injected=1",
            "GRPO_MOUNT=/etc", "injected: 1", "--port=9")
ENV_LINE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[^$\"'`\\#]*")
ENV_FILES = re.compile(r"(^|/)[^/]*\.env$")


@cache
def _base(name: str) -> dict:
    profile, engine, hosts = BASES[name]
    return spec_data(profile, engine, hosts)


def base_data(name: str) -> dict:
    return copy.deepcopy(_base(name))


def changed(name: str, changes: dict[tuple, Any]) -> dict:
    """The base spec with each path (a tuple of keys and list indices) set to its value; missing mappings are
    created on the way."""
    data = base_data(name)
    for path, value in changes.items():
        node = data
        for part in path[:-1]:
            if isinstance(node, list):
                node = node[part]
            else:
                if not isinstance(node.get(part), dict | list):
                    node[part] = {}
                node = node[part]
        node[path[-1]] = value
    return data


def dotted(text: str) -> tuple:
    """"hosts.0.address" -> ("hosts", 0, "address")."""
    return tuple(int(p) if p.isdigit() else p for p in text.split("."))


def leaf_paths(node: Any, path: tuple = ()) -> list[tuple]:
    """Every key and item path of a spec, containers included."""
    out = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += leaf_paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += leaf_paths(value, path + (i,))
    return out


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=10_000)  # non-ASCII escaped: values arrive as written


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def problems(self) -> list[str]:
        """The problem lines of a refused spec (after the `error:` header)."""
        return [line.strip() for line in self.err.splitlines()[1:]]


def cli(argv: list[str], cwd: Path) -> Run:
    """`grpo-deploy ARGV` in-process, in *cwd*; an exception (a traceback) propagates to the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: usage errors exit 2
            code = exc.code
    return Run(code, out.getvalue(), err.getvalue())


def write_spec(tmp: Path, data: Any = None, text: str | None = None, raw: bytes | None = None) -> Path:
    path = tmp / SPEC_NAME
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text(text if text is not None else dump(data), encoding="utf-8")
    return path


def render(tmp: Path, data: Any) -> tuple[Run, Path]:
    spec = write_spec(tmp, data)
    out = tmp / "render"
    return cli(["render", "-f", str(spec), "-o", str(out)], tmp), out


def rendered_files(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): p.read_text(encoding="utf-8") for p in sorted(out.rglob("*")) if p.is_file()}


def names_key(line: str, path: tuple) -> bool:
    """Whether a problem line names the key at *path*, one of its parents or children, or the key's own name."""
    keys = [key_str(path[:i]) for i in range(1, len(path) + 1)]
    return any(f": {k}:" in line or f": {k}." in line or f": {k}[" in line for k in keys) or (
        isinstance(path[-1], str) and path[-1] in line)


def assert_refused(run: Run, *, key: str | None = None, words: tuple[str, ...] = ()) -> None:
    """Exit 2, no traceback, one `error:` header line, then problem lines; *key* and *words* in one problem line
    (or in the header when the error is a one-line CLI error)."""
    assert run.code == 2, (run.code, run.out, run.err)
    assert "Traceback" not in run.err
    lines = run.err.splitlines()
    lines = [line for line in lines if not line.startswith("note: ")]
    assert lines and lines[0].startswith("error: "), run.err
    assert all(line.startswith("  ") for line in lines[1:]), run.err
    candidates = lines[1:] or lines[:1]
    wanted = ([f" {key}: "] if key else []) + list(words)
    assert any(all(w in line for w in wanted) for line in candidates), (wanted, run.err)


def preflight_problems(run: Run) -> list[str]:
    """`preflight --json` of an invalid spec: exit 2, stderr quiet, the problems in the JSON."""
    assert run.code == 2 and "Traceback" not in run.err, (run.code, run.err)
    report = json.loads(run.out)
    assert report["ok"] is False and report["exit_code"] == 2
    return report["problems"]


# ------------------------------------------------------------------ a small reader of Hydra overrides
# What Hydra's override grammar and OmegaConf make of `key=value` for the values the kit writes: plain tokens
# (typed as Hydra types them), single- or double-quoted strings (a quote ends the string unless an odd number of
# backslashes precede it; only backslashes before a quote are escapes), lists; then OmegaConf's `${`: an
# interpolation unless an odd number of backslashes precede it (an even run is halved). Raises ValueError on
# anything else, an interpolation included.

_HYDRA_KEY = re.compile(r"\+{0,2}[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_PLAIN = re.compile(r"[A-Za-z0-9_./@+-]+")
_INT = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)")
_UINT = r"(0|[1-9](_?[0-9])*)"
_POINT = rf"({_UINT}\.|{_UINT}?\.[0-9](_?[0-9])*)"
_FLOAT = re.compile(rf"[+-]?({_POINT}|({_UINT}|{_POINT})[eE][+-]?[0-9](_?[0-9])*|inf|nan)", re.IGNORECASE)


def hydra_parse(line: str) -> tuple[str, Any]:
    key, sep, rest = line.partition("=")
    if not sep or not _HYDRA_KEY.fullmatch(key):
        raise ValueError(f"not a key=value override: {line!r}")
    value, end = _element(rest, 0)
    if end != len(rest):
        raise ValueError(f"trailing text after the value: {rest[end:]!r}")
    return key, value


def _element(s: str, i: int) -> tuple[Any, int]:
    if i >= len(s):
        raise ValueError("missing value")
    if s[i] == "[":
        items: list[Any] = []
        i += 1
        if s[i:i + 1] == "]":
            return items, i + 1
        while True:
            item, i = _element(s, i)
            items.append(item)
            if s[i:i + 1] == ",":
                i += 1
            elif s[i:i + 1] == "]":
                return items, i + 1
            else:
                raise ValueError(f"bad list at {i}: {s!r}")
    if s[i] in "'\"":
        return _quoted(s, i)
    m = _PLAIN.match(s, i)
    if not m:
        raise ValueError(f"unexpected {s[i]!r} at {i}")
    text = m.group(0)
    if text.lower() in ("true", "false"):
        return text.lower() == "true", m.end()
    if text.lower() == "null":
        return None, m.end()
    if _INT.fullmatch(text):
        return int(text.replace("_", "")), m.end()
    if _FLOAT.fullmatch(text):
        return float(text.replace("_", "")), m.end()
    return text, m.end()


def _quoted(s: str, i: int) -> tuple[str, int]:
    quote, j = s[i], i + 1
    while True:
        k = s.find(quote, j)
        if k < 0:
            raise ValueError(f"unterminated quoted value: {s!r}")
        run = len(s[i + 1:k]) - len(s[i + 1:k].rstrip("\\"))
        if run % 2 == 0:
            break
        j = k + 1
    body = s[i + 1:k]
    body = re.sub(rf"(\\+)({quote}|$)", lambda m: "\\" * (len(m.group(1)) // 2) + m.group(2), body)

    def omegaconf(m: re.Match) -> str:
        n = len(m.group(1))
        if n % 2 == 0:
            raise ValueError(f"an OmegaConf interpolation in {s!r}")
        return "\\" * (n // 2) + "${"

    return re.sub(r"(\\*)\$\{", omegaconf, body), k + 1
