"""Tests of grpo_deploy.engines.base (the Engine every engine is): which image each engine's roles run, answered in
one place."""

import pytest

from grpo_deploy.engines import ENGINES, TRL_ASYNC, VERL
from grpo_deploy.engines.base import Unsupported


def test_each_role_runs_one_of_its_engines_images():
    for engine in ENGINES.values():
        assert set(engine.role_images) == set(engine.roles), engine.name
        assert {engine.image_of(r) for r in engine.roles} == set(engine.image_roles), engine.name


def test_verl_roles_share_the_verl_image_and_trl_roles_have_their_own():
    assert VERL.image_roles == ("verl",) and VERL.images_on(["head", "worker"]) == ["verl"]
    assert TRL_ASYNC.image_roles == ("server", "trainer")
    assert TRL_ASYNC.images_on(["trainer", "server"]) == ["trainer", "server"]


def test_a_role_the_engine_does_not_have_is_not_given_an_image():
    with pytest.raises(KeyError):
        VERL.image_of("server")


def test_a_supported_feature_has_no_reason_and_an_unsupported_one_is_refused_in_the_engines_words():
    for engine in ENGINES.values():
        assert engine.why_not("render") is None
        engine.refuse("render")  # supported: nothing raised
        for feature, why in engine.unsupported.items():
            assert engine.why_not(feature) == why
            with pytest.raises(Unsupported, match=f"^{why}$"):
                engine.refuse(feature)
