"""Tests of grpo_deploy.render.k8s: params.env values, the GPU placement, the admin/ objects and the trl-async server
pod's own arguments (vLLM on loopback behind the front), from real specs."""

from __future__ import annotations

import yaml

from grpo_deploy import render, spec
from grpo_deploy.common.values import MAX_PORT
from grpo_deploy.render import committed
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


def _args(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_server_pod_binds_vllm_to_loopback_behind_the_front():
    r = res("h200", "trl-async", ("a",), **{"overrides.vllm.port": 9000})
    files = render_k8s.k8s_files(r)
    vllm, front = _args(files["k8s/server.args"]), _args(files["k8s/front.args"])
    assert (_value(vllm, "--host"), _value(vllm, "--port")) == ("127.0.0.1", "9001")
    assert params(r)["vllm_port"] == "9001" and params(r)["server_port"] == "9000"
    assert _value(front, "--listen") == "0.0.0.0:9000" and "--require-token" in front
    assert _value(front, "--replica") == "http://127.0.0.1:9001" and front.count("--replica") == 1
    assert _value(front, "--adapter-dir") == f"{r.checkpoint_dir}/.vllm_lora"
    # Only --host and --port differ from the compose render's server.args, which keeps vLLM on its container's
    # interfaces (compose publishes one address).
    compose = render.server_args(r)
    assert (_value(compose, "--host"), _value(compose, "--port")) == ("0.0.0.0", "9000")
    assert [a for a in vllm if a not in ("127.0.0.1", "9001")] == [a for a in compose if a not in ("0.0.0.0", "9000")]


def test_vllm_takes_the_port_below_when_the_front_has_the_last_one():
    r = res("h200", "trl-async", ("a",), **{"overrides.vllm.port": MAX_PORT})
    files = render_k8s.k8s_files(r)
    assert _value(_args(files["k8s/server.args"]), "--port") == str(MAX_PORT - 1)
    assert _value(_args(files["k8s/front.args"]), "--replica") == f"http://127.0.0.1:{MAX_PORT - 1}"


def test_verl_pods_get_no_front():
    files = render_k8s.k8s_files(res("a100", "verl", ("a",)))
    assert "k8s/server.args" not in files and "k8s/front.args" not in files and "vllm_port" not in params(
        res("a100", "verl", ("a",)))


def test_an_overlays_generated_takes_the_pods_server_args(tmp_path):
    """generated/server.args is the pod's own (vLLM on loopback), not the compose render's of the same spec."""
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_data("h200", "trl-async", ("a",), **NFS)))
    generated = committed.k8s_generated(tmp_path)
    assert _value(_args(generated["server.args"]), "--host") == "127.0.0.1"
    assert "front.args" in generated and "params.env" in generated


def test_no_token_in_any_rendered_file(monkeypatch):
    """The run's token reaches the pods from the user's Secret only: a token in the renderer's environment (as on a
    deployer's machine during `up`) lands in no rendered file, and no file holds one of its form."""
    token = "Ab3" + "x" * 40
    monkeypatch.setenv("GRPO_RUN_TOKEN", token)
    files = render.render_files(res("h200", "trl-async", ("a",), **NFS))
    assert not [rel for rel, text in files.items() if token in text or "GRPO_RUN_TOKEN=" in text]
