"""Tests of grpo_deploy.engines.verl_knobs (verl's knobs as data): every knob's setting reaches verl's Hydra overrides,
its candidates are never the current value and resolve on the cpu and a100 specs (CPU: no TP or rollout memory), the
batch values keep verl's divisibility (the per-GPU mini-batch a multiple of the micro-batch), and plan's what-if keeps
its two knobs."""

from __future__ import annotations

import pytest
import yaml

from grpo_deploy import spec
from grpo_deploy.diagnose import verl as diagnose_verl
from grpo_deploy.engines import VERL
from grpo_deploy.engines.base import SIDES
from grpo_deploy.engines.verl import hydra_value, verl_overrides
from grpo_deploy.engines.verl_knobs import DYNAMIC, MICRO, TUNE_SIDES
from grpo_deploy.spec import resolve
from grpo_deploy.tune.knobs import apply_knob, current
from tests.specs import spec_data


def _res(data: dict):
    return resolve.resolve(spec.loads(yaml.safe_dump(data, sort_keys=False), source="s.yaml"))


def _data(profile: str, **changes) -> dict:
    data = spec_data(profile, "verl", ())
    for key, value in changes.items():
        data = apply_knob(data, f"overrides.verl.{key}", value)
    return data


def _candidates(profile: str, name: str, **changes) -> tuple:
    return VERL.knob(name).candidates(_res(_data(profile, **changes)))


def test_every_setting_reaches_verls_overrides():
    data = _data("cpu")
    for knob in VERL.tune_knobs:
        assert knob.setting.startswith("overrides.verl."), knob.name
        key = knob.setting.removeprefix("overrides.verl.")
        value = current(_res(data), knob.setting)
        value = 8 if value is None else value  # not set on cpu (dynamic batch, token cap): any value it takes
        again = _res(apply_knob(data, knob.setting, value))
        assert f"{key}={hydra_value(value)}" in verl_overrides(again), knob.name
        assert again.origins["verl"][key].source == "override", knob.name


@pytest.mark.parametrize("profile", ["cpu", "a100"])
def test_candidates_are_never_the_current_value_and_each_one_resolves(profile):
    data = _data(profile)
    res = _res(data)
    for knob in VERL.tune_knobs:
        for value in knob.candidates(res):
            assert value != current(res, knob.setting), (profile, knob.name)
            _res(apply_knob(data, knob.setting, value))


def test_the_cpu_profile_gets_no_gpu_knob():
    res = _res(_data("cpu"))
    on_cpu = {k.name: k.candidates(res) for k in VERL.tune_knobs if k.candidates(res)}
    assert on_cpu == {"micro-batch": (8,), "dynamic-batch": (True,), "log-prob-micro-batch": (8,), "rollout-n": (2, 8)}
    a100 = _res(_data("a100"))
    assert VERL.knob("rollout-tp").candidates(a100) == (2,) and VERL.knob("rollout-memory").candidates(a100) == ()
    assert _candidates("a100", "rollout-memory", **{"actor_rollout_ref.rollout.gpu_memory_utilization": 0.6}) == (0.7,)
    assert _candidates("a100", "rollout-tp", **{"actor_rollout_ref.rollout.tensor_model_parallel_size": 4}) == (2,)


def test_batch_values_keep_the_micro_batch_a_divisor_of_the_mini_batch():
    assert _candidates("a100", "micro-batch") == (80,)  # 512 x 5 / 4 GPUs = 640 answers a GPU
    assert _candidates("cpu", "micro-batch", **{MICRO: 3}) == ()  # 6 does not divide 16
    assert _candidates("cpu", "micro-batch", **{MICRO: 8}) == (16,)
    assert _candidates("cpu", "micro-batch", **{MICRO: 16}) == ()
    assert _candidates("a100", "rollout-n") == (10,)  # n 2: 256 a GPU is no multiple of 40
    assert _candidates("a100", "checkpointing") == (False,) and _candidates("cpu", "checkpointing") == ()


def test_a_dynamic_batch_replaces_the_micro_batches_by_a_token_cap():
    assert _candidates("cpu", "token-cap") == ()
    dynamic = {DYNAMIC: True}
    assert _candidates("cpu", "token-cap", **dynamic) == (32768,)
    assert _candidates("cpu", "micro-batch", **dynamic) == () and _candidates("cpu", "dynamic-batch", **dynamic) == ()
    assert _candidates("cpu", "log-prob-micro-batch", **dynamic) == ()


def test_objectives_and_sides():
    assert {k.name for k in VERL.tune_knobs if k.objective} == {"rollout-n"}
    assert "group" in VERL.knob("rollout-n").objective
    assert {k.side for k in VERL.tune_knobs} == {"trainer", "generation"} and all(k.why for k in VERL.tune_knobs)
    assert set(TUNE_SIDES) == {f"{phase}-bound" for phase in diagnose_verl.PHASES}
    assert set(TUNE_SIDES.values()) <= set(SIDES)


def test_plans_what_if_keeps_its_two_knobs():
    assert [k.label for k in VERL.what_if] == ["gradient checkpointing", "rollout n"]
    assert VERL.knob("rollout-n").what_if(_res(_data("a100"))) == ("5", "10", "rollout_n_double", False, 0)
