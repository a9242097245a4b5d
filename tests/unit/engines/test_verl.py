"""Tests of grpo_deploy.engines.verl: a host's GPUs against trainer.n_gpus_per_node, Hydra override values, the Ray
cluster's head address, the data folder."""

import pytest

from grpo_deploy import spec
from grpo_deploy.engines import verl
from grpo_deploy.spec import resolve
from grpo_deploy.templating import RenderError
from tests.specs import spec_yaml


def test_verl_refuses_a_host_listing_fewer_gpus_than_n_gpus_per_node():

    text = spec_yaml("a100", "verl", ("n1", "n2"), **{"hosts.1.gpus": {"worker": [0, 1]}})
    with pytest.raises(spec.SpecError, match=r"hosts\[1\]\.gpus\.worker: 2 GPU\(s\) listed for worker but "
                                             r"trainer\.n_gpus_per_node is 4"):
        resolve.resolve(spec.loads(text, source="s.yaml"))
    resolve.resolve(spec.loads(spec_yaml("a100", "verl", ("n1", "n2"), **{"hosts.1.gpus": {"worker": [0, 1, 2, 3]}}),
                               source="s.yaml"))



def test_hydra_values_read_back_as_written():
    assert verl.hydra_value(True) == "True" and verl.hydra_value(None) == "null" and verl.hydra_value(3) == "3"
    assert verl.hydra_value("Qwen/Qwen2.5-3B") == "Qwen/Qwen2.5-3B"  # safe characters: plain
    assert verl.hydra_value("1e3") == "'1e3'" and verl.hydra_value("inf") == "'inf'"  # would read as a number
    assert verl.hydra_value("a b") == "'a b'" and verl.hydra_value(["x", "y"]) == '["x","y"]'
    assert verl.hydra_value("${oc.env:WANDB_API_KEY}") == "'\\${oc.env:WANDB_API_KEY}'"  # never an interpolation
    with pytest.raises(RenderError, match="control character"):
        verl.hydra_value("a\nb=c")


def test_a_cluster_of_two_hosts_joins_the_head_at_its_address():
    two = resolve.resolve(spec.loads(spec_yaml("a100", "verl", ("n1", "n2")), source="s.yaml"))
    assert verl.is_cluster(two) and [h.name for h in verl.cluster_hosts(two)] == ["n1", "n2"]
    assert verl.head_address(two, {"n1": "10.0.0.7"}) == f"10.0.0.7:{verl.GCS_PORT}"
    assert verl.head_address(two, {}) == f"n1:{verl.GCS_PORT}"  # Ray resolves the name itself
    one = resolve.resolve(spec.loads(spec_yaml("cpu", "verl", ()), source="s.yaml"))
    assert not verl.is_cluster(one) and len(verl.cluster_hosts(one)) == 1


def test_data_dir_is_the_parquet_files_folder_or_the_share():
    res = resolve.resolve(spec.loads(spec_yaml("cpu", "verl", ()), source="s.yaml"))
    assert verl.data_dir(res) == f"/shared/data/{res.settings.data.dataset}"
    assert verl.VERL.total_steps(res) > 0
