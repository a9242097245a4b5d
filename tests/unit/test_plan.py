"""Tests of grpo_deploy.plan: model sizes, checkpoint sizes, the seed-000 disk case, and the save the seed-000
replay's scenario fails at from per-save sizes."""

from __future__ import annotations

import json

import pytest

from grpo_deploy import plan, spec
from grpo_deploy.cli import main
from grpo_deploy.spec import new_spec, resolve
from tests.specs import spec_yaml


def seed000_text(keep: str = "all") -> str:
    """Seed 000: Qwen2.5-3B, LoRA r64, 15 epochs of GSM8K at batch 1024 = 105 steps, save every 20."""
    text = new_spec.spec_text("a100", "verl", ["node1"])
    text = text.replace("  keep: null ", f"  keep: {keep} ").replace("overrides: {}",
                                                                     "overrides: {verl: {trainer.total_epochs: 15}}")
    return text


def _resolved(text: str):
    return resolve.resolve(spec.loads(text))


def test_seed000_schedule_is_105_steps_saving_every_20():
    res = _resolved(seed000_text())
    assert plan.total_steps(res) == 105
    assert plan.save_steps(res, 105) == [20, 40, 60, 80, 100, 105]


def _ckpt(res) -> int:
    arch = plan.Architecture.from_dict(res.architecture)
    return plan.checkpoint_bytes(res, arch)[0]


def test_seed000_runs_out_of_disk_at_step_80_and_recommends_keep_2():
    res = _resolved(seed000_text("all"))
    free = int(3.5 * _ckpt(res))
    p = plan.make_plan(res, free_bytes=free, filesystem="/ckpt")
    assert p.disk.fits is False and p.ok is False
    assert (p.disk.fails_at_save, p.disk.fails_at_step) == (4, 80)
    assert p.disk.recommended_keep == 2
    assert p.disk.extra_needed_bytes > 0
    assert "step 80" in " ".join(p.disk.explanation)


def test_plan_text_is_the_plan_the_cli_prints():
    p = plan.make_plan(_resolved(seed000_text("all")), free_bytes=10**9, filesystem="/ckpt")
    text = plan.plan_text(p, "forecast: (stand-in)")
    assert text.startswith(f"run {p.run}: engine verl, model ") and "\n\nforecast: (stand-in)\n" in text
    assert "DOES NOT FIT" in text and "saved at steps 20, 40, 60, 80, 100, 105 of 105" in text
    assert text.endswith("\n\n(--explain lists every setting with where it came from and why)")
    explained = plan.plan_text(p, "forecast: (stand-in)", explain=True)
    assert "(--explain" not in explained and "\nsetting " in explained


@pytest.mark.parametrize("keep,fits", [(2, True), (3, False)])
def test_seed000_with_retention(keep, fits):
    res = _resolved(seed000_text(str(keep)))
    free = int(3.5 * _ckpt(res))
    assert plan.make_plan(res, free_bytes=free).disk.fits is fits


def test_verl_checkpoint_is_dominated_by_fp32_base_weights():
    res = _resolved(seed000_text())
    ckpt = _ckpt(res)
    assert 13e9 < ckpt < 14.5e9  # 3.09 B x 4 B + LoRA + Adam


def test_trl_checkpoint_counts_adapters_kept_on_the_volume():
    res = _resolved(new_spec.spec_text("gb10", "trl-async", ["a", "b"]))
    p = plan.make_plan(res, free_bytes=10**12)
    assert p.disk.adapters_kept == 6 and p.disk.adapter_bytes > 0 and p.disk.fits


def test_unknown_model_warns_instead_of_guessing():
    p = plan.make_plan(_resolved(spec_yaml(**{"model.path": "org/unknown-model"})))
    assert p.disk is None and "model.architecture" in p.warnings[0]


def test_cli_plan_seed000_json(tmp_path, capsys):
    f = tmp_path / "spec.yaml"
    f.write_text(seed000_text("all"))
    ckpt = _ckpt(_resolved(seed000_text()))
    rc = main(["plan", "-f", str(f), "--json", "--free-space", f"node1={int(3.5 * ckpt)}B"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["disk"]["fails_at_step"] == 80 and out["disk"]["recommended_keep"] == 2


def test_cli_plan_measures_the_real_filesystem(tmp_path, capsys):
    """A host with shared_dir: plan reads statvfs of that real directory."""
    shared = tmp_path / "nfs"
    shared.mkdir()
    text = spec_yaml("cpu", hosts=(), **{"hosts.0.shared_dir": str(shared)})
    f = tmp_path / "spec.yaml"
    f.write_text(text)
    assert main(["plan", "-f", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    import shutil

    assert out["disk"]["filesystem"] == str(shared)
    assert abs(out["disk"]["free_bytes"] - shutil.disk_usage(shared).free) < 64 * 1024**2


def test_tiny_model_entry_matches_the_model_the_image_bakes():
    from grpo_deploy.runtime import tiny_model

    entry = resolve.known_models()["/opt/grpo-deploy/models/tiny-qwen2"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "tie_word_embeddings"):
        assert entry[key] == tiny_model.ARCHITECTURE[key], key
    assert entry["vocab_size"] == len(tiny_model.SPECIAL_TOKENS) + len(tiny_model.CHARACTERS)


def test_the_seed_scenario_fails_at_the_4th_save_from_per_save_sizes():
    changes = {"checkpoints.save_every": 2, "checkpoints.keep": "all", "checkpoints.disk_margin_gb": 0.0,
               "overrides": {"trl": {"max_steps": 8}}}
    res = resolve.resolve(spec.loads(spec_yaml("cpu", hosts=(), **changes)))
    arch = plan.Architecture.from_dict(res.architecture)
    sizes = [plan.checkpoint_bytes(res, arch, s)[0] for s in (2, 4, 6, 8)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    d0 = plan.make_plan(res, free_bytes=10**9).disk
    fixed = d0.adapter_bytes * d0.adapters_kept
    just_three = fixed + sum(sizes[:3])
    d = plan.make_plan(res, free_bytes=just_three).disk
    assert (d.fails_at_save, d.fails_at_step) == (4, 8) and d.peak_bytes == fixed + sum(sizes)
    assert plan.make_plan(res, free_bytes=just_three - 1).disk.fails_at_step == 6
    assert "KB per checkpoint" in " ".join(d.explanation)  # not "0.0 GB"
