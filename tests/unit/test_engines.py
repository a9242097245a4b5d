"""Tests of grpo_deploy.engines: which image each engine's roles run, answered in one place."""

import pytest

from grpo_deploy.engines import ENGINES, TRL_ASYNC, VERL


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
