"""Tests of grpo_deploy.tune.knobs: a knob value written into a copy of a spec's data (overrides created as needed,
verl's dotted keys kept whole, hosts picked by role or index, unknown paths refused), read back from the resolved spec,
and the knobs a tune tries by side, by `diagnose`'s verdict or by name."""

from __future__ import annotations

import copy

import pytest
import yaml

from grpo_deploy import spec
from grpo_deploy.engines import TRL_ASYNC, VERL
from grpo_deploy.spec import resolve
from grpo_deploy.tune.knobs import apply_knob, current, select
from tests.specs import spec_data


def _res(data: dict):
    return resolve.resolve(spec.loads(yaml.safe_dump(data, sort_keys=False), source="s.yaml"))


def test_an_override_is_written_into_a_copy_creating_its_section():
    data = spec_data("cpu", "trl-async", ())
    assert data["overrides"] == {}
    before = copy.deepcopy(data)
    out = apply_knob(data, "overrides.trl.token_budget", 512)
    assert data == before  # the caller's data is not touched
    assert out["overrides"] == {"trl": {"token_budget": 512}}
    out = apply_knob({**out, "overrides": None}, "overrides.vllm.max_num_seqs", 64)  # `overrides:` left empty
    assert out["overrides"] == {"vllm": {"max_num_seqs": 64}}
    res = _res(apply_knob(data, "overrides.trl.token_budget", 512))
    assert res.settings.trl.token_budget == 512 and res.origins["trl"]["token_budget"].source == "override"


def test_a_verl_key_stays_one_dotted_key():
    data = apply_knob(spec_data("cpu", "verl", ()), "overrides.verl.actor_rollout_ref.rollout.n", 2)
    assert data["overrides"]["verl"] == {"actor_rollout_ref.rollout.n": 2}
    assert _res(data).settings.verl.rollout_n == 2


def test_hosts_are_picked_by_role_or_by_index():
    data = spec_data("h200", "trl-async", ("t", "s"))
    out = apply_knob(data, "hosts[server].replicas", 2)
    assert [h["replicas"] for h in out["hosts"]] == [None, 2]
    assert current(_res(out), "hosts[server].replicas") == 2
    assert [h["replicas"] for h in apply_knob(data, "hosts[0].replicas", 3)["hosts"]] == [3, None]
    assert apply_knob(data, "checkpoints.keep", 5)["checkpoints"]["keep"] == 5
    with pytest.raises(ValueError, match="no item of hosts has role head"):
        apply_knob(data, "hosts[head].replicas", 2)
    with pytest.raises(ValueError, match="hosts has 2 item"):
        apply_knob(data, "hosts[2].replicas", 2)


@pytest.mark.parametrize("setting", ["overides.trl.token_budget", "overrides.server.port", "overrides.trl",
                                     "trainer.token_budget", "hosts[server]", "hosts.replicas", "run.seed[0].x"])
def test_a_path_the_spec_does_not_have_is_refused(setting):
    with pytest.raises(ValueError):
        apply_knob(spec_data("cpu", "trl-async", ()), setting, 1)


def test_current_reads_the_merged_value():
    res = _res(spec_data("cpu", "trl-async", ()))
    assert current(res, "overrides.trl.max_inflight_tasks") == 8  # profile cpu
    assert current(res, "overrides.vllm.max_loras") == 4  # derived: max_staleness 2 + 2
    assert current(res, "overrides.runtime.trainer_processes") is None  # nothing sets it
    assert current(res, "run.seed") == 0 and current(res, "hosts[server].replicas") is None
    verl = _res(spec_data("cpu", "verl", ()))
    assert current(verl, "overrides.verl.actor_rollout_ref.rollout.n") == 4  # a field, by its alias
    assert current(verl, "overrides.verl.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") == 4  # passed through


def test_select_by_side_by_verdict_and_by_name():
    res = _res(spec_data("cpu", "trl-async", ()))
    sync = select(TRL_ASYNC, res, "weight-sync")
    assert [(k.name, c) for k, c in sync] == [("sync-every", (4,))]
    assert select(TRL_ASYNC, res, "sync-bound") == sync
    trainer = [k.name for k, _ in select(TRL_ASYNC, res, "trainer-bound")]
    assert trainer[:2] == ["packing", "checkpointing"] and all(k.side == "trainer" for k, _ in
                                                               select(TRL_ASYNC, res, "trainer"))
    assert [k.name for k, _ in select(TRL_ASYNC, res, names=["inflight", "packing"])] == ["inflight", "packing"]
    with pytest.raises(ValueError, match="no knob 'packign'.*packing"):
        select(TRL_ASYNC, res, names=["packign"])
    with pytest.raises(ValueError, match="names no side"):
        select(TRL_ASYNC, res, "balanced")
    verl = _res(spec_data("cpu", "verl", ()))
    assert {k.side for k, _ in select(VERL, verl, "actor update-bound")} == {"trainer"}
    assert [k.name for k, _ in select(VERL, verl, "generation-bound")] == ["rollout-tp", "rollout-memory", "rollout-n"]
