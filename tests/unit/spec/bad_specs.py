"""Test helper of the spec tests: init's gb10 pair as text, and the problems a spec text is refused with."""

from __future__ import annotations

import pytest

from grpo_deploy import spec
from grpo_deploy.spec import new_spec, resolve

PAIR = new_spec.spec_text("gb10", "trl-async", ["spark1", "spark2"])


def problems(text: str) -> list[spec.Problem]:
    """The problems loading and resolving *text* (as bad.yaml) raises; fails when it raises none."""
    with pytest.raises(spec.SpecError) as info:
        resolve.resolve(spec.loads(text, source="bad.yaml"))
    return info.value.problems


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)
