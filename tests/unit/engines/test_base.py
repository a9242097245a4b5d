"""Tests of grpo_deploy.engines.base (the Engine every engine is): which image each engine's roles run, answered in
one place; its knobs (TuneKnob) by name and side, and plan's what-if drawn from them."""

import pytest

from grpo_deploy.engines import ENGINES, TRL_ASYNC, VERL
from grpo_deploy.engines.base import SIDES, TuneKnob, Unsupported


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


def test_a_knob_is_found_by_name_and_has_a_known_side():
    for engine in ENGINES.values():
        names = [k.name for k in engine.tune_knobs]
        assert len(names) == len(set(names)), engine.name  # a name is one knob: `tune --knobs` takes it
        assert all(engine.knob(n).name == n for n in names)
        assert all(k.side in SIDES for k in engine.tune_knobs)
        assert engine.what_if == tuple(k for k in engine.tune_knobs if k.what_if is not None)
    with pytest.raises(KeyError, match="engine verl has no knob 'packing'.*micro-batch"):
        VERL.knob("packing")
    with pytest.raises(ValueError, match="side 'sync' is not one of trainer, generation, weight-sync"):
        TuneKnob("x", "overrides.trl.weight_sync_steps", "sync", lambda res: (), "", "why")


def test_the_answer_cap_check_auto_is_off_for_length_rewards_alone_and_0_2_otherwise():
    # The cpu rehearsal's brevity reward is paid for leaving the cap: its first answers sit there by design.
    from grpo_deploy.spec import resolve
    from tests.specs import loaded

    brevity = resolve.resolve(loaded("cpu", "trl-async", ("local",), **{"hosts.0.address": "local"}))
    assert brevity.settings.data.rewards == ["brevity"]
    assert TRL_ASYNC.watch(brevity)["settings"]["cap_share"] is None
    verl = resolve.resolve(loaded("cpu", "verl", ("local",), **{"hosts.0.address": "local"}))
    assert VERL.watch(verl)["settings"]["cap_share"] is None
    math = resolve.resolve(loaded("h100", "trl-async", ("h",)))
    assert set(math.settings.data.rewards) - {"brevity"}, math.settings.data.rewards
    assert TRL_ASYNC.watch(math)["settings"]["cap_share"] == 0.2
    given = resolve.resolve(loaded("cpu", "trl-async", ("local",), **{"hosts.0.address": "local",
                                                                       "watch.cap_share": 0.2}))
    assert TRL_ASYNC.watch(given)["settings"]["cap_share"] == 0.2  # a number in the spec is kept
    off = resolve.resolve(loaded("h100", "trl-async", ("h",), **{"watch.cap_share": None}))
    assert TRL_ASYNC.watch(off)["settings"]["cap_share"] is None
