"""Tests of grpo_deploy.deploy.bringup (the table of the engines' bring-ups): every registered engine has one, each
serving the engine it is filed under, all under the same function names."""

from grpo_deploy.deploy.bringup import BRINGUP
from grpo_deploy.engines import ENGINES

FUNCTIONS = ("hosts", "addresses", "addresses_words", "start", "follow", "restart", "after_failure")


def test_every_engine_has_its_bring_up():
    assert set(BRINGUP) == set(ENGINES)
    for engine, module in BRINGUP.items():
        assert module.ENGINE == engine


def test_each_bring_up_has_the_same_functions():
    for module in BRINGUP.values():
        missing = [name for name in FUNCTIONS if not callable(getattr(module, name, None))]
        assert not missing, (module.__name__, missing)
