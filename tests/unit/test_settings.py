"""Tests of grpo_deploy.settings: every VllmSettings field declares its vLLM flag or why it has none, the declarations
agree with the field types, and the flags the kit owns are derived from the fields and the kit's table."""

from __future__ import annotations

from typing import Annotated, get_args

import pytest
from pydantic import create_model

from grpo_deploy import settings
from grpo_deploy.settings import VLLM_KIT_FLAGS, NotAFlag, VllmFlag, VllmSettings, vllm_declaration, vllm_flags


@pytest.mark.parametrize("name", list(VllmSettings.model_fields))
def test_every_vllm_field_is_a_flag_or_says_why_not(name):
    declared = vllm_declaration(name)
    assert isinstance(declared, (VllmFlag, NotAFlag)), f"vllm.{name} declares neither its flag nor why it has none"
    assert declared.why.strip() if isinstance(declared, NotAFlag) else declared.name.startswith("--")


@pytest.mark.parametrize("name", list(vllm_flags()))
def test_a_boolean_field_is_a_switch_or_toggle_and_only_it(name):
    annotation = VllmSettings.model_fields[name].annotation
    boolean = annotation is bool or bool in get_args(annotation)
    assert boolean == (vllm_flags()[name].kind != "value"), name
    if vllm_flags()[name].kind == "toggle":
        assert type(None) in get_args(annotation), f"{name}: a toggle needs null for vLLM's default"


def test_every_kit_flag_is_placed_before_a_flag_field():
    assert {kit.before for kit in VLLM_KIT_FLAGS} <= set(vllm_flags())


def test_no_flag_is_claimed_twice():
    spellings = [s for kit in VLLM_KIT_FLAGS for s in (kit.name, *kit.aliases)]
    spellings += [s for flag in vllm_flags().values() for s in flag.spellings()]
    assert len(spellings) == len(set(spellings)) == len(settings.VLLM_OWNED_FLAGS)


def test_owned_flags_are_every_spelling_of_every_rendered_flag():
    owned = settings.VLLM_OWNED_FLAGS
    for name, flag in vllm_flags().items():
        assert {s: owned.get(s) for s in flag.spellings()} == dict.fromkeys(flag.spellings(), f"overrides.vllm.{name}")
    for kit in VLLM_KIT_FLAGS:
        assert owned[kit.name] == (kit.setting or f"({kit.why})")
    assert {"--no-enable-prefix-caching", "--no-enforce-eager", "--device-memory-utilization", "-tp"} <= set(owned)


def test_a_new_field_with_a_flag_is_owned(monkeypatch):
    grown = create_model("Grown", __base__=VllmSettings,
                         block_size=(Annotated[int | None, VllmFlag("--block-size")], None))
    monkeypatch.setattr(settings, "VllmSettings", grown)
    assert settings._owned_flags()["--block-size"] == "overrides.vllm.block_size"


@pytest.mark.parametrize(("flag", "value", "lines"), [
    (VllmFlag("--x"), 3, ["--x", "3"]), (VllmFlag("--x"), None, []),
    (VllmFlag("--x", "switch"), True, ["--x"]), (VllmFlag("--x", "switch"), False, []),
    (VllmFlag("--x", "toggle"), True, ["--x"]), (VllmFlag("--x", "toggle"), False, ["--no-x"]),
    (VllmFlag("--x", "toggle"), None, []),
])
def test_flag_args(flag, value, lines):
    assert flag.args(value) == lines
