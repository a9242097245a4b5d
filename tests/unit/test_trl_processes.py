"""Tests of the trl-async engine's trainer processes (grpo_deploy.engines.trl_async: runtime.trainer_processes, one per
trainer GPU by default on cuda, any count on cpu, in trainer.yaml as `processes`)."""

import pytest
import yaml

from grpo_deploy import render, resolve, spec
from grpo_deploy.engines.trl_async import trainer_processes
from tests.specs import spec_yaml


def _res(profile="cpu", hosts=("a",), **changes):
    return resolve.resolve(spec.loads(spec_yaml(profile, "trl-async", hosts, **changes), source="s.yaml"))


def _trainer_yaml(res) -> dict:
    return yaml.safe_load(render.render_files(res)["config/trainer.yaml"])


def test_one_process_keeps_today_s_trainer_config():
    res = _res()
    assert trainer_processes(res) == 1 and "processes" not in _trainer_yaml(res)


def test_cpu_takes_any_count_and_says_it_in_the_trainer_config():
    res = _res(**{"overrides.runtime": {"trainer_processes": 2}})
    assert trainer_processes(res) == 2 and _trainer_yaml(res)["processes"] == 2


def test_cuda_defaults_to_one_process_and_takes_up_to_one_per_trainer_gpu():
    """Not yet run on GPUs here, so several processes are asked for, not assumed (HF's shape: 2 trainer GPUs)."""
    res = _res("h200", ("t", "s"))
    assert trainer_processes(res) == 1 and "processes" not in _trainer_yaml(res)
    two = _res("h200", ("t", "s"), **{"overrides.runtime": {"trainer_processes": 2}})
    assert trainer_processes(two) == 2 and _trainer_yaml(two)["processes"] == 2
    assert trainer_processes(_res("gb10", ("t", "s"))) == 1


def test_cuda_refuses_more_processes_than_trainer_gpus():
    with pytest.raises(spec.SpecError, match=r"overrides\.runtime\.trainer_processes: .* is 3 but the trainer on t has "
                                             r"2 GPU\(s\) \(\[0, 1\]\): FSDP2 runs one process per GPU; set it to 2 "
                                             r"or fewer"):
        _res("h200", ("t", "s"), **{"overrides.runtime": {"trainer_processes": 3}})
    with pytest.raises(spec.SpecError, match=r"is 2 but the trainer on a has 1 GPU\(s\)"):
        _res("h200", **{"overrides.runtime": {"trainer_processes": 2}})  # one host: the server on 0, the trainer on 1


@pytest.mark.parametrize("value", [0, -1, 65, "2", True, 2.0, 10**30])
def test_hostile_counts_are_refused_at_the_door(value):
    with pytest.raises(spec.SpecError, match=r"overrides\.runtime\.trainer_processes"):
        _res(**{"overrides.runtime": {"trainer_processes": value}})


def test_plan_shows_the_trainer_processes_beside_its_gpus():
    res = _res("h200", ("t", "s"), **{"hosts.1.replicas": 2,  # HF's recipe: 2 trainer GPUs + 2 replicas
                                      "overrides.runtime": {"trainer_processes": 2}})
    trainer, server = res.spec.hosts
    assert res.engine_info.gpu_words(res, trainer) == "trainer 0,1 (2 trainer processes, FSDP2)"
    assert res.engine_info.gpu_words(res, server) == "server 0; server-2 1"
    cpu = _res(**{"overrides.runtime": {"trainer_processes": 3}})
    assert cpu.engine_info.gpu_words(cpu, cpu.spec.hosts[0]).endswith("(3 trainer processes, FSDP2)")


def test_diagnose_names_the_next_trainer_process_from_the_spec():
    """A trainer-bound run (the Spark baseline's recorded stream) on cpu with 2 processes: the last knob is a third."""
    from pathlib import Path

    from grpo_deploy.runtime.metrics import read_events

    events = read_events(str(Path(__file__).parent / "metrics" / "spark_trainer_bound.jsonl"))
    res = _res(**{"overrides.runtime": {"trainer_processes": 2}})
    found, _labels = res.engine_info.diagnose(events, res)
    assert found.side == "trainer-bound"
    assert (found.next_knobs[-1].setting, found.next_knobs[-1].value) == ("overrides.runtime.trainer_processes", "3")
