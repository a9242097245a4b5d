"""Tests of grpo_deploy.engines.trl_knobs (trl-async's knobs as data): every knob's setting is a key the spec reads,
its candidates are never the current value and resolve on each profile's spec (CPU: no GPU-only switch), the values
follow the hardware (a GPU of the trainer's own, a shared or unified one, one server GPU or two), and plan's what-if
keeps its four knobs."""

from __future__ import annotations

import pytest
import yaml

from grpo_deploy import spec
from grpo_deploy.diagnose import trl_async as diagnose
from grpo_deploy.engines import TRL_ASYNC
from grpo_deploy.engines.base import SIDES
from grpo_deploy.engines.trl_knobs import TUNE_SIDES
from grpo_deploy.spec import resolve
from grpo_deploy.tune.knobs import apply_knob, current
from tests.specs import spec_data

SPECS = {"cpu": ("cpu", ()), "gb10": ("gb10", ()), "gb10 x2": ("gb10", ("t", "s")), "h200": ("h200", ()),
         "h200 x2": ("h200", ("t", "s")), "h100": ("h100", ())}
"""Specs of `init`: one host, or a trainer host and a server host."""
GPU_ONLY = ("compile", "lora-elementwise", "base-bf16", "liger")


def _res(data: dict):
    return resolve.resolve(spec.loads(yaml.safe_dump(data, sort_keys=False), source="s.yaml"))


def _data(case: str, **changes) -> dict:
    profile, hosts = SPECS[case]
    data = spec_data(profile, "trl-async", hosts)
    for setting, value in changes.items():
        data = apply_knob(data, setting, value)
    return data


def _candidates(case: str, name: str, **changes) -> tuple:
    return TRL_ASYNC.knob(name).candidates(_res(_data(case, **changes)))


def test_every_setting_is_a_key_the_spec_reads():
    data = _data("cpu")
    res = _res(data)
    for knob in TRL_ASYNC.tune_knobs:
        value = current(res, knob.setting)
        value = 1 if value is None else value  # unset (trainer processes, replicas): the value that means the same
        again = _res(apply_knob(data, knob.setting, value))
        assert current(again, knob.setting) == value, knob.name
        if knob.setting.startswith("overrides."):
            _, section, key = knob.setting.split(".", 2)
            assert again.origins[section][key].source == "override", knob.name


@pytest.mark.parametrize("case", sorted(SPECS))
def test_candidates_are_never_the_current_value_and_each_one_resolves(case):
    data = _data(case)
    res = _res(data)
    for knob in TRL_ASYNC.tune_knobs:
        now = current(res, knob.setting)
        now = 1 if now is None and knob.name in ("replicas", "trainer-processes") else now
        for value in knob.candidates(res):
            assert value != now, (case, knob.name)
            _res(apply_knob(data, knob.setting, value))  # a SpecError here: a candidate the spec refuses


def test_the_cpu_profile_gets_no_gpu_only_switch_and_would_refuse_them():
    res = _res(_data("cpu"))
    assert {name: TRL_ASYNC.knob(name).candidates(res) for name in GPU_ONLY} == dict.fromkeys(GPU_ONLY, ())
    for setting, value in (("overrides.runtime.base_dtype", "bf16"), ("overrides.runtime.fused_kernels", "liger")):
        with pytest.raises(spec.SpecError):  # what the table keeps off the CPU, the spec refuses there
            _res(apply_knob(_data("cpu"), setting, value))
    on_cpu = {k.name: k.candidates(res) for k in TRL_ASYNC.tune_knobs if k.candidates(res)}
    assert on_cpu == {"packing": (512,), "trainer-processes": (2,), "replicas": (2,), "inflight": (16,),
                      "staleness": (4,), "vllm-memory": (0.2,), "sync-every": (4,)}


def test_packing_starts_at_the_field_budget_and_grows_only_where_the_trainer_has_its_own_memory():
    assert _candidates("cpu", "packing") == (512,)
    assert _candidates("cpu", "packing", **{"overrides.trl.token_budget": 1024}) == (2048,)
    assert _candidates("h200", "packing", **{"overrides.trl.token_budget": 0}) == (16384,)
    assert _candidates("h200", "packing") == (32768,)  # the trainer has GPU 1 to itself
    assert _candidates("h100", "packing") == ()  # one GPU shared with vLLM: plan's split holds it
    assert _candidates("gb10 x2", "packing") == ()  # unified memory


def test_the_speed_switches_follow_the_runtime():
    assert _candidates("gb10", "compile") == (True,) and _candidates("h200", "compile") == ()  # on there already
    assert _candidates("gb10", "lora-elementwise") == ()  # not without compile_layers
    assert _candidates("gb10", "lora-elementwise", **{"overrides.runtime.compile_layers": True}) == (True,)
    assert _candidates("h200", "lora-elementwise", **{"overrides.runtime.lora_elementwise": False,
                                                      "overrides.lora.r": 8}) == ()  # rank 8: nothing to fuse
    assert _candidates("gb10", "base-bf16") == ("bf16",)
    assert _candidates("gb10", "base-bf16", **{"overrides.trl.fp16": True}) == ()  # no bf16 autocast
    assert _candidates("h200", "liger") == ("liger",) and _candidates("gb10", "liger") == ()  # arm64: no liger


def test_replicas_and_trainer_processes_need_gpus_of_their_own():
    assert _candidates("h200", "replicas") == ()  # one host: the server has GPU 0 only
    assert _candidates("h200 x2", "replicas") == (2,)  # a server host of two GPUs
    assert _candidates("h200 x2", "replicas", **{"hosts[server].replicas": 2}) == ()  # a third would share
    assert _candidates("gb10 x2", "replicas") == ()
    assert _candidates("h200", "trainer-processes") == () and _candidates("h200 x2", "trainer-processes") == (2,)
    assert _candidates("cpu", "trainer-processes", **{"overrides.runtime.trainer_processes": 2}) == (4,)


def test_generation_knobs_stop_where_the_engine_would_refuse_or_nothing_changes():
    assert _candidates("cpu", "inflight") == (16,)
    assert _candidates("cpu", "inflight", **{"overrides.trl.max_inflight_tasks": 100}) == ()  # 200 > 4 x 32
    assert _candidates("cpu", "max-num-seqs") == ()  # 8 in flight, 32 batched: more changes nothing
    assert _candidates("cpu", "max-num-seqs", **{"overrides.trl.max_inflight_tasks": 100}) == (64,)
    assert _candidates("cpu", "staleness", **{"overrides.vllm.max_loras": 4}) == ()  # 6 adapters would not fit
    assert _candidates("h200", "vllm-memory") == (0.95,) and _candidates("h100", "vllm-memory") == ()
    assert _candidates("cpu", "vllm-memory", **{"overrides.vllm.gpu_memory_utilization": 0.2}) == ()


def test_objectives_name_what_changes_the_loss():
    changing = {k.name for k in TRL_ASYNC.tune_knobs if k.objective}
    assert changing == {"packing", "trainer-processes", "staleness", "sync-every"}
    assert "per-token" in TRL_ASYNC.knob("packing").objective and "#7206" in TRL_ASYNC.knob("packing").objective
    assert "learning rate" in TRL_ASYNC.knob("staleness").objective
    assert all(k.why and k.side in SIDES for k in TRL_ASYNC.tune_knobs)
    assert {k.side for k in TRL_ASYNC.tune_knobs} == set(SIDES)


def test_each_diagnosis_verdict_with_knobs_maps_to_a_side():
    assert set(TUNE_SIDES) <= set(diagnose.SIDES) and set(TUNE_SIDES.values()) == set(SIDES)
    assert set(diagnose.SIDES) - set(TUNE_SIDES) == {"balanced", "not enough data"}


def test_plans_what_if_keeps_its_four_knobs():
    assert [k.label for k in TRL_ASYNC.what_if] == ["packing (trl.token_budget)", "gradient checkpointing",
                                                   "server replicas", "trainer processes"]  # as plan printed them
    res = _res(_data("h200 x2"))
    assert TRL_ASYNC.knob("replicas").what_if(res) == ("1", "2", "replica_added", False, 2)
    assert TRL_ASYNC.knob("packing").what_if(res) == ("on", "off", "packing_on", True, 0)
