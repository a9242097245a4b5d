"""Tests of grpo_deploy.engines.trl_memory through plan and preflight (issue 40): one GPU for both roles on h100 —
`init` -> `render` -> `plan` shows the split with its reasons and exits 0; vLLM at 0.9 of the GPU leaves the trainer
short: plan exits 1 with one line naming the side, need vs available, by how much and the fix, and preflight's memory
check refuses it in one line before `up` starts anything. CPU only: the arithmetic and the words, not a GPU run."""

from __future__ import annotations

import json

import pytest
import yaml

from grpo_deploy import plan, preflight
from grpo_deploy.engines import trl_memory
from grpo_deploy.spec import profiles, resolve
from tests.hostile.helpers import cli
from tests.specs import loaded

SPLIT = "server+trainer share GPU 0 (vLLM 0.3 of 80 GB, trainer the rest)"
MEASURED = "measured: the GPU harness on one NVIDIA H200 with vLLM beside it (2026-12-06), 16,384 tokens, 50.75 GiB"


def _init(tmp_path, gmu: float | None = None):
    path = tmp_path / "spec.yaml"
    run = cli(["init", "--profile", "h100", "--engine", "trl-async", "-o", str(path)], tmp_path)
    assert run.code == 0, run.err
    if gmu is not None:
        data = yaml.safe_load(path.read_text())
        data["overrides"] = {"vllm": {"gpu_memory_utilization": gmu}}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_h100_one_host_renders_one_gpu_for_both_and_plan_shows_the_split(tmp_path):
    path = _init(tmp_path)
    assert cli(["render", "-f", str(path), "-o", str(tmp_path / "r")], tmp_path).code == 0
    gpu = yaml.safe_load((tmp_path / "r" / "hosts" / "local.gpu.yaml").read_text())
    ids = {name: s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
           for name, s in gpu["services"].items()}
    assert ids == {"server": ["0"], "trainer": ["0"]}
    run = cli(["plan", "-f", str(path), "--free-space", "local=100GB"], tmp_path)
    assert run.code == 0, run.out
    assert SPLIT in run.out and "memory on" not in run.out
    data = json.loads(cli(["plan", "--json", "-f", str(path), "--free-space", "local=100GB"], tmp_path).out)
    (host,) = data["hosts"]
    server, trainer = host["memory"]
    assert data["ok"] is True and host["gpus"] == SPLIT
    assert server["budget_gb"] == 24.0 and server["full_length_sequences"] >= 128  # max_num_seqs at full length
    assert "starts first" in server["why"]
    assert trainer["need_gb"] == 54.5 and trainer["available_gb"] == 54.8 and trainer["fits"] is True
    assert trainer["why"].startswith(MEASURED) and "2 x 0.6 GB CUDA contexts" in trainer["why"]


def test_vllm_at_0_9_leaves_the_trainer_short_plan_exits_1_and_preflight_refuses_in_one_line(tmp_path):
    path = _init(tmp_path, gmu=0.9)
    run = cli(["plan", "-f", str(path), "--free-space", "local=100GB"], tmp_path)
    assert run.code == 1
    (line,) = [x for x in run.out.splitlines() if x.startswith("memory on ")]
    assert line.startswith("memory on local: trainer on GPU 0 shared with the server is short by 47.7 GB: needs "
                           f"54.5 GB ({MEASURED}), has 6.8 GB (80 GB x (1 - 0.9) - 2 x 0.6 GB CUDA contexts")
    assert "-> fix: lower overrides.vllm.gpu_memory_utilization to 0.3; or turn on " \
           "overrides.trl.gradient_checkpointing; or give the trainer its own GPU" in line
    pre = cli(["preflight", "--json", "--only", "memory", "-f", str(path)], tmp_path)
    assert pre.code == preflight.EXIT_FAILED
    (result,) = json.loads(pre.out)["checks"]
    assert result["verdict"] == "fail" and "\n" not in result["fact"]
    assert "trainer on GPU 0 shared with the server is short by 47.7 GB" in result["fact"]
    assert result["hint"].startswith("lower overrides.vllm.gpu_memory_utilization to 0.3")


def test_the_memory_check_runs_before_anything_is_shipped_or_started():
    """`up` runs the checks before_shipping first and stops at a failure ('nothing was started'): memory is one of
    them, right after the spec, and reads no host."""
    assert preflight.names()[:2] == ["spec", "memory"] and "memory" in preflight.before_shipping()
    res = resolve.resolve(loaded("h100", "trl-async", ("h",), overrides={"vllm": {"gpu_memory_utilization": 0.9}}))
    ctx = preflight.Context(res)
    (r,) = preflight.run_checks(ctx, only=["memory"])
    assert r.verdict == preflight.FAIL and r.host == "h" and not ctx.connectors  # no host was reached


def test_the_suggested_fraction_fits():
    res = resolve.resolve(loaded("h100", "trl-async", ("h",), overrides={"vllm": {"gpu_memory_utilization": 0.3}}))
    assert plan.memory_shortfalls(plan.role_plans(res)) == []


@pytest.mark.parametrize(("overrides", "need", "source"), [
    ({"trl": {"token_budget": 8192}}, 28.8, MEASURED + ", scaled to 8,192 tokens"),
    ({"runtime": {"compile_layers": False, "lora_elementwise": False}}, None, "rough estimate"),
    ({"trl": {"token_budget": 0}}, None, "rough estimate"),
    ({"lora": {"r": 8}}, None, "rough estimate"),
])
def test_the_measured_peak_applies_only_where_the_run_matches_it(overrides, need, source):
    res = resolve.resolve(loaded("h100", "trl-async", ("h",), overrides=overrides))
    (host,) = plan.role_plans(res)
    trainer = host.memory[1]
    assert trainer["why"].startswith(source), trainer["why"]
    if need is not None:
        assert trainer["need_gb"] == need


def test_another_model_of_the_same_shape_uses_the_figure_and_another_shape_does_not():
    same = resolve.resolve(loaded("h100", "trl-async", ("h",), **{"model.path": "Qwen/Qwen2.5-1.5B-Instruct"}))
    other = resolve.resolve(loaded("h100", "trl-async", ("h",), **{"model.path": "Qwen/Qwen2.5-3B-Instruct"}))
    assert plan.role_plans(same)[0].memory[1]["why"].startswith(MEASURED)
    assert plan.role_plans(other)[0].memory[1]["why"].startswith("rough estimate")


def test_the_figure_is_read_from_the_profile_with_its_settings():
    ref = profiles.load("h100").reference["trl-async"]["trainer_peak_gib"]
    assert ref.unit == "GiB" and ref.value == 50.75 and ref.profile == "_hf-recipe"
    assert dict(ref.at)["trl.token_budget"] == 16384 and dict(ref.at)["runtime.base_dtype"] == "bf16"
    assert trl_memory.CUDA_CONTEXT_GB == 0.6


@pytest.mark.parametrize(("block", "words"), [
    ("at: {trl.nope: 1}", "not a setting"),
    ("at: {nosection.x: 1}", "not a setting"),
    ("at: [1]", "must be a mapping"),
    ("at: {trl.token_budget: [1, 2]}", "not a single value"),
])
def test_a_bad_at_is_refused(tmp_path, monkeypatch, block, words):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "p.yaml").write_text("name: p\nengines: [trl-async]\nhardware: {accelerator: none}\nreference:\n"
                                   "  trl-async:\n    trainer_peak_gib: {value: 3, unit: GiB, source: x, "
                                   + block + "}\n")
    with pytest.raises(profiles.ProfileError, match=words):
        profiles._compose(folder, "p")
