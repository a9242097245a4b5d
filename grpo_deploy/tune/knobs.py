"""The knobs of a tune (pure, no I/O): a value written into a copy of a spec's YAML data at a knob's setting
(apply_knob), the value a resolved spec has there now (current), and the engine's knobs a tune tries, by side
(a knob side, or `diagnose`'s verdict) or by name, each with its candidates for the spec (select)."""

from __future__ import annotations

import copy
import re
from typing import Any

from grpo_deploy.engines.base import SIDES, Engine, TuneKnob
from grpo_deploy.settings import OVERRIDE_SECTIONS
from grpo_deploy.spec.schema import DeploymentSpec

# One part of a setting: a key, optionally picking list items by index (hosts[0]) or by role (hosts[server]).
_PART = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<pick>[A-Za-z0-9_-]+)\])?")


def apply_knob(data: dict, setting: str, value: Any) -> dict:
    """A copy of a spec's YAML *data* with *value* at *setting* (*data* is left as it was). `overrides.<section>.<key>`
    takes the rest of the setting as the key (verl's are dotted: overrides.verl.actor_rollout_ref.rollout.n) and
    creates the overrides section as needed; any other setting is a dotted path from a top-level key of the spec,
    creating mappings as needed, where `key[i]` picks item i of a list and `key[role]` every item whose roles include
    role (`hosts[server].replicas`). ValueError for a top-level key or overrides section the spec does not have, or
    a path through something that is not a mapping or a list; the spec's loader judges the rest (unknown keys, types,
    cross-field rules)."""
    if not isinstance(data, dict):
        raise ValueError("a spec's data is a mapping")
    out = copy.deepcopy(data)
    head, _, rest = setting.partition(".")
    if head == "overrides":
        section, _, key = rest.partition(".")
        if section not in OVERRIDE_SECTIONS or not key:
            raise ValueError(f"{setting!r}: not an override (overrides.<section>.<key>, sections: "
                             f"{', '.join(OVERRIDE_SECTIONS)})")
        _mapping(_mapping(out, "overrides", setting), section, setting)[key] = value
        return out
    parts = setting.split(".")
    matches = [_PART.fullmatch(part) for part in parts]
    if not all(matches) or matches[0]["key"] not in DeploymentSpec.model_fields:
        raise ValueError(f"{setting!r}: not a spec key (top-level keys: {', '.join(DeploymentSpec.model_fields)})")
    if matches[-1]["pick"] is not None:
        raise ValueError(f"{setting!r}: a setting ends in a key, not in a pick of list items")
    nodes = [out]
    for m in matches[:-1]:
        nodes = [child for node in nodes for child in _children(node, m["key"], m["pick"], setting)]
    for node in nodes:
        node[matches[-1]["key"]] = value
    return out


def _mapping(node: dict, key: str, setting: str) -> dict:
    """*node*[*key*], a mapping (created when missing or null)."""
    child = node.get(key)
    if child is None:
        child = node[key] = {}
    if not isinstance(child, dict):
        raise ValueError(f"{setting!r}: {key} is not a mapping in this spec")
    return child


def _children(node: dict, key: str, pick: str | None, setting: str) -> list[dict]:
    if pick is None:
        return [_mapping(node, key, setting)]
    items = node.get(key)
    if not isinstance(items, list):
        raise ValueError(f"{setting!r}: {key} is not a list in this spec")
    if pick.isdigit():
        if int(pick) >= len(items):
            raise ValueError(f"{setting!r}: {key} has {len(items)} item(s)")
        chosen = [items[int(pick)]]
    else:
        chosen = [item for item in items if isinstance(item, dict) and pick in (item.get("roles") or ())]
        if not chosen:
            raise ValueError(f"{setting!r}: no item of {key} has role {pick}")
    if not all(isinstance(item, dict) for item in chosen):
        raise ValueError(f"{setting!r}: an item of {key} is not a mapping")
    return chosen


def current(res, setting: str) -> Any:
    """The value *setting* has in the resolved spec *res* (grpo_deploy.spec.resolve.Resolved): an override section's
    merged value (profile, spec, derived: None where nothing sets it), else the spec's own field; for a pick of
    several list items, their one value when they agree, else the list of them."""
    head, _, rest = setting.partition(".")
    if head == "overrides":
        section, _, key = rest.partition(".")
        return getattr(res.settings, section).model_dump(by_alias=True).get(key)
    values = [res.spec]
    for part in setting.split("."):
        m = _PART.fullmatch(part)
        if m is None:
            raise ValueError(f"{setting!r}: not a spec key")
        values = [getattr(v, m["key"]) for v in values]
        if m["pick"] is not None:
            pick = m["pick"]
            values = [item for items in values for k, item in enumerate(items)
                      if (str(k) == pick if pick.isdigit() else pick in getattr(item, "roles", ()))]
    return values[0] if len(set(map(repr, values))) == 1 else values


def select(engine: Engine, res, side: str | None = None,
           names: list[str] | tuple[str, ...] | None = None) -> list[tuple[TuneKnob, tuple]]:
    """(knob, its candidates for *res*) for each of *engine*'s knobs, in its order (*names*: those, in that order) on
    *side*: one of SIDES, or `diagnose`'s verdict (trainer-bound ...), which the engine maps to one. A knob whose
    candidates are () does not apply to this spec (the caller says so). ValueError for an unknown name or side, or a
    verdict that names no side (balanced, not enough data)."""
    knobs = list(engine.tune_knobs)
    if names:
        try:
            knobs = [engine.knob(name) for name in names]
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
    if side is not None:
        wanted = engine.tune_sides.get(side, side)
        if wanted not in SIDES:
            raise ValueError(f"{side!r} names no side whose knobs a tune tries (sides: {', '.join(SIDES)}; "
                             f"engine {engine.name}'s verdicts: {', '.join(engine.tune_sides)})")
        knobs = [k for k in knobs if k.side == wanted]
    return [(k, tuple(k.candidates(res))) for k in knobs]
