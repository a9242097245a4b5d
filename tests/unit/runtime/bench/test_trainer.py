"""The trainer bench: FLOP formulas (flops.py) on known shapes, and a tiny run end to end on CPU (and on CUDA)."""

from __future__ import annotations

import argparse
import json
import platform

import pytest

from grpo_deploy.runtime.bench import flops, synthetic_rollouts
from grpo_deploy.runtime.bench import trainer as bench_trainer

TINY_SHAPE = flops.ModelShape(hidden=4, layers=2, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10)


def test_flop_counts_on_a_known_shape():
    # Per layer: q 4x4, k 4x2, v 4x2, o 4x4, gate/up 4x8, down 8x4 = 144 weights; two layers = 288.
    assert TINY_SHAPE.layer_params == 288 and TINY_SHAPE.head_params == 40
    assert TINY_SHAPE.lora_params(1) == 2 * (8 + 6 + 6 + 8 + 12 + 12 + 12)
    work = flops.Work(forwarded=10, trained=6, pairs=30)
    attention = 3 * 2 * (4 * 2 * 2 * 30)  # fwd+bwd x layers x (4 x heads x head_dim x pairs)
    assert flops.model_flops(TINY_SHAPE, work) == 6 * 288 * 10 + 6 * 40 * 6 + attention == 21600
    assert flops.lora_flops(TINY_SHAPE, work, 1) == 4 * 288 * 10 + 4 * 40 * 6 + attention + 6 * 128 * 10
    assert flops.mfu(21600, 2.0, 10800) == pytest.approx(100.0)


def test_qwen25_shape_has_the_published_parameter_count():
    shape = flops.ModelShape(1536, 28, 12, 2, 128, 8960, 151936)
    assert shape.layer_params + shape.head_params == pytest.approx(1.54e9, rel=0.01)  # biases and norms left out
    assert shape.lora_params(1) == 28 * (1536 + 1536 + 1536 + 256 + 1536 + 256 + 1536 + 1536 + 3 * (1536 + 8960))


def test_causal_pairs_align_bottom_right():
    assert flops.causal_pairs([0, 3], [0, 3]) == 6  # 1 + 2 + 3
    assert flops.causal_pairs([0, 2, 5], [0, 5, 8]) == (2 * 3 + 3) + 6  # 2 queries over 5 keys, then a square 3


def test_trl_flops_is_trls_own_formula():
    pytest.importorskip("trl")
    from transformers import Qwen2Config
    from trl.trainer.utils import compute_flops_per_token

    config = Qwen2Config(**synthetic_rollouts.QWEN25_15B)
    shape = flops.ModelShape.from_config(config)
    work = flops.Work(forwarded=14600, trained=13000, pairs=0)
    assert flops.trl_flops(shape, work, samples=10) == compute_flops_per_token(config, 1460) * 14600


def test_peak_lookup_prefers_the_specific_name():
    assert flops.peak_flops("NVIDIA H200") == 989e12
    assert flops.peak_flops("NVIDIA H200 NVL") == 835e12
    assert flops.peak_flops("cpu") is None


def test_microbatch_spans_take_the_device_events_where_there_are_some():
    from grpo_deploy.runtime.bench import packed_step

    class Event:
        def __init__(self, ms):
            self.ms = ms

        def elapsed_time(self, other):
            return other.ms - self.ms

    assert packed_step.microbatch_spans([(1.0, None), (1.5, None), (3.0, None)]) == {
        "microbatch_s": [0.5, 1.5], "host_microbatch_s": [0.5, 1.5]}
    spans = packed_step.microbatch_spans([(1.0, Event(0.0)), (1.25, Event(400.0)), (1.5, Event(1000.0))])
    assert spans == {"microbatch_s": [0.4, 0.6], "host_microbatch_s": [0.25, 0.25]}


@pytest.fixture
def bench_args(monkeypatch, tmp_path):
    packing = pytest.importorskip("trl.experimental.async_grpo.packing")
    from grpo_deploy.runtime.trainer import attention_shim

    monkeypatch.setattr(packing, "_flash_attn", packing._flash_attn)  # the bench installs the shim; undone after
    monkeypatch.setattr(attention_shim.SHIM, "backend", attention_shim.SHIM.backend)
    parser = argparse.ArgumentParser()
    bench_trainer.add_arguments(parser)
    return lambda *argv: parser.parse_args(["--tiny", "--budgets", "512", "--out", str(tmp_path / "r.json"), *argv])


SPEED_ROWS = "today;bf16;liger;compile+lora-ew"  # each switch once: the base in bf16, Liger, compile, LoRA fused


def test_tiny_bench_runs_on_cpu(bench_args, capsys):
    args = bench_args("--device", "cpu", "--speed-rows", SPEED_ROWS)
    assert bench_trainer.run(args) == 0
    report = json.loads(open(args.out).read())
    assert report["machine"] == platform.machine()  # what the arm64 run under QEMU checks (tests/arm64_switches.py)
    speed = {r["switches"]: r for r in report["speed"]}
    assert set(speed) == {"today", "bf16", "liger", "compile+lora-ew"}
    assert "needs bf16 autocast" in speed["bf16"]["skipped"], "CPU times fp32: a bf16 base is checked, not timed"
    assert "need a CUDA device" in speed["liger"]["skipped"]
    compiled = speed["compile+lora-ew"]
    assert compiled["tokens_per_s"] > 0 and compiled["graphs_warmup"] > 0 and compiled["recompiles_in_step"] == 0
    assert compiled["compile_s"] >= 0 and speed["today"]["graphs_warmup"] == 0
    spans = compiled["microbatch_s"]
    assert len(spans) == len(compiled["host_microbatch_s"]) == compiled["microbatches"]
    assert all(s > 0 for s in spans) and sum(spans) <= compiled["seconds"]
    checked = {r["switches"]: r for r in report["exactness"]["rows"]}
    assert checked["bf16"]["exact"] and checked["compile+lora-ew"]["exact"], checked
    assert "need a CUDA device" in checked["liger"]["skipped"]
    rows = {(r["token_budget"], r["gradient_checkpointing"]): r for r in report["configs"]}
    assert set(rows) == {(b, c) for b in (0, 256, 512) for c in (False, True)}
    assert all(r["tokens_per_s"] > 0 and r["mfu_model"] is None for r in rows.values())
    assert rows[(256, False)]["forwarded_tokens"] < rows[(0, False)]["forwarded_tokens"]
    assert rows[(256, False)]["trained_tokens"] == rows[(0, False)]["trained_tokens"]
    sdpa = [a for a in report["attention"] if a["backend"] == "sdpa"]
    assert len(sdpa) == 2 and all(a["exact"] for a in sdpa)
    out = capsys.readouterr().out
    assert "packing off/on" in out and "MFU LoRA" in out and "token budget sweep" in out


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_tiny_bench_on_cuda_reports_memory_and_attention_paths(bench_args):
    args = bench_args("--device", "cuda", "--peak-tflops", "989")
    assert bench_trainer.run(args) == 0
    report = json.loads(open(args.out).read())
    assert all(r["peak_gib"] > 0 and r["mfu_model"] > 0 for r in report["configs"])
    assert report["attention_choices"]  # `fastest` picked a backend at the first call
    assert {a["backend"] for a in report["attention"] if a["exact"]} >= {"varlen"}


def test_a_switch_that_breaks_in_the_exactness_step_is_a_row_not_a_lost_report(monkeypatch):
    """On arm64 under QEMU, Inductor's C++ compile of the compiled rows failed inside the exactness step and the
    whole bench exited without a report; such a row now says how it failed, and the other rows are kept."""
    from grpo_deploy.runtime.bench import report as bench_report
    from grpo_deploy.runtime.bench import speed as bench_speed
    from grpo_deploy.runtime.trainer import speed as trainer_speed

    def check_row(label, model, batches, device, reference, today):
        if "compile" in label:
            raise RuntimeError("CppCompileError: C++ compile error")
        return {"switches": label, "loss": 1.0, "vs_fp32": {"loss": 0.0, "grad": 0.0},
                "vs_today": {"loss": 0.0, "grad": 0.0}, "tolerance": {"loss": 1.0, "grad": 1.0}, "exact": True,
                "_today": (1.0, None, None)}

    monkeypatch.setattr(bench_speed, "check_batches", lambda samples, budget: [])
    monkeypatch.setattr(bench_speed, "reference_step", lambda *args: (1.0, None))
    monkeypatch.setattr(bench_speed, "build_policy", lambda *args, **kwargs: object())
    monkeypatch.setattr(bench_speed, "check_row", check_row)
    rows = [trainer_speed.Switches.parse(t) for t in ("today", "compile+lora-ew", "bf16")]
    report = bench_speed.exactness(None, None, None, [], 128, "cpu", rows)
    checked = {r["switches"]: r for r in report["rows"]}
    assert checked["compile+lora-ew"] == {"switches": "compile+lora-ew",
                                          "failure": "RuntimeError: CppCompileError: C++ compile error"}
    assert checked["today"]["exact"] and checked["bf16"]["exact"]
    assert "CppCompileError" in bench_report.exactness_text({**report, "fp32_loss": 1.0})
