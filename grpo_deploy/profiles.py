"""Hardware profiles: load the data files in grpo_deploy/profiles/ (each setting is a value and its reason)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

SECTIONS = ("model", "lora", "data", "trl", "vllm", "verl", "runtime", "checkpoints")


@dataclass(frozen=True)
class Setting:
    value: Any
    why: str


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    hardware: dict[str, Any]
    engines: tuple[str, ...]
    images: dict[str, str]
    settings: dict[str, dict[str, Setting]]

    def value(self, section: str, key: str, default: Any = None) -> Any:
        setting = self.settings.get(section, {}).get(key)
        return default if setting is None else setting.value

    @property
    def accelerator(self) -> str:
        return self.hardware.get("accelerator", "none")


class ProfileError(ValueError):
    """A profile file is malformed or unknown."""


def names() -> list[str]:
    folder = resources.files("grpo_deploy") / "profiles"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


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
            parsed[key] = Setting(entry["value"], str(entry["why"]))
        settings[section] = parsed
    return Profile(
        name=raw["name"],
        description=raw.get("description", ""),
        hardware=dict(raw.get("hardware") or {}),
        engines=tuple(raw.get("engines") or ()),
        images=dict(raw.get("images") or {}),
        settings=settings,
    )


@cache
def load(name: str) -> Profile:
    if name not in names():
        raise ProfileError(f"unknown profile {name!r}; known profiles: {', '.join(names())}")
    text = (resources.files("grpo_deploy") / "profiles" / f"{name}.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    if raw.get("name") != name:
        raise ProfileError(f"profile file {name}.yaml declares name {raw.get('name')!r}")
    return _parse(name, raw)
