"""Hardware profiles: load the data files in grpo_deploy/profiles/ (each setting is a value and its reason), a
profile's `extends:` merged over its parent.

The merge rule: the child's keys over the parent's; `hardware`, `images` and each settings section are merged key by
key; a setting (`{value, why}`: a value never travels without its reason), a list and a scalar are replaced whole;
`name` is never inherited; `reference` (measured figures per engine, each `{value, unit, source}` and, for a figure
that holds only under some settings, `at:` those settings) is merged engine by engine, figure by figure. A file named
`_*.yaml` is a base: it can be extended, never chosen by a host. Each file is read once, bounded (yamlpos), and must
be a regular file inside the profiles folder (a link may point only there).
"""

from __future__ import annotations

import math
import re
import stat
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from grpo_deploy.common.shown import shown
from grpo_deploy.engines import ENGINE_NAMES
from grpo_deploy.settings import SECTIONS as SETTINGS_SECTIONS
from grpo_deploy.spec.yamlpos import YamlSyntaxError, load_file, shown_path

SECTIONS = tuple(SETTINGS_SECTIONS)
MAX_EXTENDS = 4
"""How many parents a chain may have (a profile extends a base that extends another needs two)."""
_NAME = re.compile(r"_?[a-z0-9][a-z0-9-]{0,39}")
"""A profile's name, as its file is named: no path separator, `..`, `$`, newline or leading `-` can pass."""


@dataclass(frozen=True)
class Setting:
    value: Any
    why: str
    profile: str
    """The profile whose file holds this line: a parent's when inherited."""


REFERENCE_FIGURES = {
    "step_s": "s",
    "startup_s": "s",
    "packing_on": "x step time",
    "checkpointing_off": "x step time",
    "rollout_n_double": "x step time",
    "replica_added": "x step time",
    "trainer_processes_double": "x step time",
    "trainer_peak_gib": "GiB",
}
"""The figures a profile's `reference:` may give per engine, with the one unit each is in: seconds per optimizer step
and `up` -> first step; and what-if factors on the step time (time with the knob changed / time without): packing
switched on, gradient checkpointing switched off, rollout n doubled (verl), one more server replica, twice the trainer
processes (trl-async). grpo_deploy.forecast reads them. And the trainer's measured peak GPU memory (allocated, its
CUDA context not counted) under the settings its `at:` names: the trl-async engine's memory estimate reads it."""
MAX_REFERENCE = 1e7
"""The largest reference figure (about 4 months in seconds): anything larger is a typo."""


@dataclass(frozen=True)
class Reference:
    """A measured figure with its unit and where it was measured (a seed, docs/MEASUREMENTS.md)."""

    value: float
    unit: str
    source: str
    profile: str
    """The profile whose file holds it: a parent's when inherited."""
    at: tuple[tuple[str, Any], ...] = ()
    """The settings it was measured under (`section.key`, value), in the file's order; () = any."""


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    hardware: dict[str, Any]
    engines: tuple[str, ...]
    images: dict[str, str]
    settings: dict[str, dict[str, Setting]]
    extends: str | None = None
    reference: dict[str, dict[str, Reference]] = field(default_factory=dict)
    """engine -> figure name (REFERENCE_FIGURES) -> the figure."""

    def value(self, section: str, key: str, default: Any = None) -> Any:
        setting = self.settings.get(section, {}).get(key)
        return default if setting is None else setting.value

    @property
    def accelerator(self) -> str:
        return self.hardware.get("accelerator", "none")


class ProfileError(ValueError):
    """A profile file is malformed or unknown."""


def _folder() -> Path:
    return Path(str(resources.files("grpo_deploy") / "profiles"))


def _files(folder: Path) -> list[str]:
    """Every profile in *folder* by name, bases (`_*`) included: what `extends:` may name."""
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def names() -> list[str]:
    """The profiles a host may choose (bases left out)."""
    return [n for n in _files(_folder()) if not n.startswith("_")]


def engine_mismatch(profile: Profile, engine: str) -> str | None:
    """Why *profile* cannot run *engine*, naming the profiles that can; None when it can."""
    if engine in profile.engines:
        return None
    fitting = [n for n in names() if engine in load(n).engines]
    return (f"profile {profile.name!r} does not support engine {engine!r} (it supports "
            f"{', '.join(profile.engines)}); profiles for {engine}: {', '.join(fitting)}")


def _parse(name: str, raw: dict[str, Any]) -> Profile:
    settings: dict[str, dict[str, Setting]] = {}
    for section, entries in (raw.get("settings") or {}).items():
        if section not in SECTIONS:
            raise ProfileError(f"profile {name}: unknown settings section {section!r}; allowed: {', '.join(SECTIONS)}")
        parsed = {}
        for key, entry in (entries or {}).items():
            if not isinstance(entry, dict) or set(entry) != {"value", "why"} or not str(entry["why"]).strip():
                raise ProfileError(f"profile {name}: settings.{section}.{key} must be {{value: ..., why: '...'}}")
            parsed[key] = Setting(entry["value"], str(entry["why"]), name)
        settings[section] = parsed
    return Profile(
        name=raw["name"],
        description=raw.get("description", ""),
        hardware=dict(raw.get("hardware") or {}),
        engines=tuple(raw.get("engines") or ()),
        images=dict(raw.get("images") or {}),
        settings=settings,
        reference=_references(name, raw.get("reference")),
    )


def _references(name: str, raw: Any) -> dict[str, dict[str, Reference]]:
    """A profile's `reference:` block, validated: engine -> figure -> {value: positive finite number, unit: the
    figure's unit, source: non-empty one-line text}."""
    if raw is None:
        return {}
    where = f"profile {name}: reference"
    if not isinstance(raw, dict):
        raise ProfileError(f"{where} must be a mapping of engine -> figures")
    out: dict[str, dict[str, Reference]] = {}
    for engine, figures in raw.items():
        if engine not in ENGINE_NAMES or not isinstance(figures, dict):
            raise ProfileError(f"{where}.{_short(engine)}: expected an engine ({', '.join(ENGINE_NAMES)}) holding a "
                               "mapping")
        parsed = {}
        for key, entry in figures.items():
            at = f"{where}.{engine}.{_short(key)}"
            if key not in REFERENCE_FIGURES:
                raise ProfileError(f"{at}: unknown figure; known: {', '.join(REFERENCE_FIGURES)}")
            if not isinstance(entry, dict) or set(entry) - {"at"} != {"value", "unit", "source"}:
                raise ProfileError(f"{at} must be {{value: ..., unit: ..., source: '...'}} (and optionally at: "
                                   "{section.key: value})")
            value, unit, source = entry["value"], entry["unit"], entry["source"]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or not 0 < value <= MAX_REFERENCE:
                raise ProfileError(f"{at}.value: {_short(value)} is not a positive finite number up to "
                                   f"{MAX_REFERENCE:g}")
            if unit != REFERENCE_FIGURES[key]:
                raise ProfileError(f"{at}.unit: {_short(unit)}; this figure is in {REFERENCE_FIGURES[key]!r}")
            if not isinstance(source, str) or not source.strip() or not source.isprintable():
                raise ProfileError(f"{at}.source: must be one line of text naming where the figure was measured")
            parsed[key] = Reference(float(value), unit, source, name, _conditions(at, entry.get("at", {})))
        out[engine] = parsed
    return out


def _conditions(where: str, raw: Any) -> tuple[tuple[str, Any], ...]:
    """A reference figure's `at:`: a mapping of settings (`section.key`, a section of grpo_deploy.settings and one of
    its fields) to a scalar each."""
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}.at must be a mapping of setting (section.key) -> value")
    for key, value in raw.items():
        section, _, field_name = str(key).partition(".")
        fields = SETTINGS_SECTIONS[section].model_fields if section in SETTINGS_SECTIONS else {}
        if field_name not in fields:
            raise ProfileError(f"{where}.at.{_short(key)}: not a setting; write section.key with a section of "
                               f"{', '.join(SECTIONS)} and one of its keys")
        if not isinstance(value, str | int | float | bool):
            raise ProfileError(f"{where}.at.{key}: {_short(value)} is not a single value (text, number, true/false)")
    return tuple(raw.items())


def _inherit(parent: Profile, raw: dict[str, Any], child: Profile) -> Profile:
    """*child* (parsed from *raw*) over *parent*, by the merge rule of this module's docstring."""
    sections = [s for s in SECTIONS if s in parent.settings or s in child.settings]
    return replace(
        child,
        description=child.description if "description" in raw else parent.description,
        hardware={**parent.hardware, **child.hardware},
        engines=child.engines if "engines" in raw else parent.engines,
        images={**parent.images, **child.images},
        settings={s: {**parent.settings.get(s, {}), **child.settings.get(s, {})} for s in sections},
        extends=parent.name,
        reference={e: {**parent.reference.get(e, {}), **child.reference.get(e, {})}
                   for e in dict.fromkeys([*parent.reference, *child.reference])},
    )


def _read(folder: Path, name: str) -> dict[str, Any]:
    """The mapping in *folder*/<name>.yaml: a regular file inside *folder*, bounded, declaring its own name."""
    path = folder / f"{name}.yaml"
    where = shown_path(path)
    if path.is_symlink() and not path.resolve().is_relative_to(folder.resolve()):
        raise ProfileError(f"{where}: is a link out of the profiles folder (to {shown_path(path.resolve())}); "
                           "put the profile file itself in the folder")
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        raise ProfileError(f"{where}: is not a regular file (a FIFO, device or folder); "
                           "a profile is a YAML file")
    try:
        raw = load_file(path).data
    except YamlSyntaxError as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: holds no mapping; a profile is a mapping with name, hardware, settings")
    if raw.get("name") != name:
        raise ProfileError(f"profile file {name}.yaml declares name {raw.get('name')!r}")
    return raw


def _parent(folder: Path, name: str, raw: dict[str, Any], chain: tuple[str, ...]) -> str | None:
    """The validated `extends:` of profile *name* (None when it extends nothing); *chain*: the profiles below it."""
    if "extends" not in raw:
        return None
    parent, where = raw["extends"], f"{shown_path(folder / f'{name}.yaml')}: extends"
    if not isinstance(parent, str) or not _NAME.fullmatch(parent):
        raise ProfileError(f"{where}: {_short(parent)} is not a profile name; give the name of a file in the profiles "
                           "folder without .yaml (lowercase letters, digits, '-', a leading '_' for a base)")
    if parent == name:
        raise ProfileError(f"{where}: the profile extends itself; name another profile or remove the key")
    if parent in chain:
        raise ProfileError(f"{where}: {' -> '.join((*chain, name, parent))} is a cycle; remove one of the extends")
    if len(chain) >= MAX_EXTENDS:
        raise ProfileError(f"{where}: the chain {' -> '.join((*chain, name, parent))} is deeper than {MAX_EXTENDS} "
                           "parents; extend a profile nearer the base")
    if parent not in _files(folder):
        raise ProfileError(f"{where}: no profile {shown(parent)}; known: {', '.join(_files(folder))}")
    return parent


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}..."


def _compose(folder: Path, name: str, chain: tuple[str, ...] = ()) -> Profile:
    """Profile *name* from *folder*, its parents merged under it."""
    raw = _read(folder, name)
    parent = _parent(folder, name, raw, chain)
    child = _parse(name, raw)
    return child if parent is None else _inherit(_compose(folder, parent, (*chain, name)), raw, child)


@cache
def load(name: str) -> Profile:
    if name not in names():
        raise ProfileError(f"unknown profile {shown(name)}; known profiles: {', '.join(names())}")
    return _compose(_folder(), name)
