"""Tests of grpo_deploy.render.k8s: params.env values, the GPU placement and the admin/ objects, from real specs."""

from __future__ import annotations

import yaml

from grpo_deploy import spec
from grpo_deploy.render import folder as render_folder
from grpo_deploy.render import k8s as render_k8s
from grpo_deploy.spec import resolve
from tests.specs import loaded, spec_data

NFS = {"storage.nfs": {"server": "nfs1.lab.internal", "export": "/srv/grpo", "options": "nfsvers=4.1,hard"}}


def res(*args, **changes):
    return resolve.resolve(loaded(*args, **changes))


def params(r) -> dict[str, str]:
    return render_folder.parse_env(render_k8s.params_text(r))


def test_model_cache_on_the_mount_and_offline_only_for_a_path():
    hub = params(res("h200", "trl-async", ("a",), **{"storage.mount": "/data/grpo"}))
    assert hub["hf_home"] == "/data/grpo/hf-cache" and hub["hf_offline"] == "0"
    path = params(res("h200", "trl-async", ("a",), **{"model.path": "/data/grpo/models/m", "model.served_name": "m",
                                                       "storage.mount": "/data/grpo"}))
    assert path["hf_offline"] == "1"


def test_verl_params_size_the_ray_cluster():
    one = params(res("a100", "verl", ("a",)))
    assert (one["gpus_per_node"], one["ray_workers"]) == ("4", "0")
    hosts = [{"name": "h", "address": "ray-head", "profile": "a100", "roles": ["head"]},
             {"name": "w1", "address": "ray-w1", "profile": "a100", "roles": ["worker"]},
             {"name": "w2", "address": "ray-w2", "profile": "a100", "roles": ["worker"]},
             {"name": "w3", "address": "ray-w3", "profile": "a100", "roles": ["worker"]}]
    data = spec_data("a100", "verl", ("a",), **NFS)
    data["hosts"] = hosts
    four = params(resolve.resolve(spec.loads(yaml.safe_dump(data), source="spec.yaml")))
    assert (four["gpus_per_node"], four["ray_workers"]) == ("4", "3")
    assert "ray_workers" not in params(res("h200", "trl-async", ("a",)))


def test_placement_only_for_gpu_profiles_with_the_profiles_products():
    files = render_k8s.k8s_files(res("h200", "trl-async", ("a",)))
    doc = yaml.safe_load(files["k8s/placement.yaml"])
    assert doc["metadata"]["annotations"] == {"config.kubernetes.io/local-config": "true"}
    (term,) = doc["spec"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.product", "operator": "In",
                                         "values": ["NVIDIA-H200", "NVIDIA-H200-NVL"]}]
    assert "k8s/placement.yaml" not in render_k8s.k8s_files(res("cpu", "trl-async", ("a",)))


def test_admin_reserves_the_pv_for_the_runs_claim():
    files = render_k8s.k8s_files(res("gb10", "trl-async", **{"run.name": "exp-7", **NFS}))
    kust = yaml.safe_load(files["k8s/admin/kustomization.yaml"])
    assert kust["resources"] == ["namespace.yaml", "shared-pv.yaml"]
    assert yaml.safe_load(files["k8s/admin/namespace.yaml"])["metadata"]["name"] == "exp-7"
    pv = yaml.safe_load(files["k8s/admin/shared-pv.yaml"])
    assert pv["metadata"]["name"] == "grpo-shared-exp-7"
    assert pv["spec"]["claimRef"] == {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "exp-7",
                                      "name": "shared"}
    assert pv["spec"]["nfs"] == {"server": "nfs1.lab.internal", "path": "/srv/grpo"}
    assert pv["spec"]["mountOptions"] == ["nfsvers=4.1", "hard"] and pv["spec"]["storageClassName"] == ""
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"


def test_no_admin_without_nfs():
    files = render_k8s.k8s_files(res("h200", "trl-async", ("a",)))
    assert not [f for f in files if f.startswith("k8s/admin/")]
