"""Tests of grpo_deploy.common.strict: the strict base refuses unknown keys and type coercion, and is immutable."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from grpo_deploy.common.strict import Strict


class Section(Strict):
    steps: int
    """How many steps."""
    name: str = "x"


def test_a_strict_section_refuses_unknown_keys_and_coercion():
    assert Section(steps=3).steps == 3
    for bad in ({"steps": 3, "stpes": 4}, {"steps": "3"}, {"steps": True}, {"steps": 3, "name": 5}):
        with pytest.raises(ValidationError):
            Section.model_validate(bad)


def test_a_strict_section_is_immutable_and_documented_by_its_docstrings():
    section = Section(steps=1)
    with pytest.raises(ValidationError):
        section.steps = 2
    assert Section.model_fields["steps"].description == "How many steps."
