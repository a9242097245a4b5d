"""The trainer bench (runtime/bench/trainer.py): a tiny run end to end on CPU (and on CUDA), its report and tables."""

from __future__ import annotations

import argparse
import json
import platform

import pytest

from grpo_deploy.runtime.bench import trainer as bench_trainer


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


