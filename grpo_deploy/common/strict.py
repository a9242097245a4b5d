"""The one strict pydantic base of every schema the kit reads (the spec, the settings, the trainer's config): unknown
keys refused, no type coercion, immutable, each field described by its attribute docstring."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A section: unknown keys refused, no type coercion (YAML's `on` is not a number or a mode), immutable.

    A model that differs (passes unknown keys through, or may be assigned to) subclasses this and overrides only
    that key of `model_config`, with a comment saying why; pydantic merges the rest from here."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)
