"""The bench's plain-text tables (runtime/bench/report.py): which rows each table holds, how a missing value, a
skipped or failed row and an inexact path are shown, and which parts of a report the whole text carries."""

from __future__ import annotations

from grpo_deploy.runtime.bench import report


def config_row(budget: int, checkpointing: bool, **values) -> dict:
    return {"token_budget": budget, "gradient_checkpointing": checkpointing, "seconds": 2.0, "tokens_per_s": 12345.6,
            "trained_tokens_per_s": 1000.0, "samples_per_hour": 3600.0, "peak_gib": None, "mfu_model": 12.34,
            "mfu_lora": None, "mfu_trl": 3.9, **values}


def lines_of(text: str, first: str) -> list[str]:
    return [line for line in text.splitlines() if line.split() and line.split()[0] == first]


def test_the_main_table_holds_packing_off_and_the_budget_and_the_sweep_every_budget():
    rows = [config_row(0, False), config_row(256, False), config_row(512, False), config_row(512, True),
            {"token_budget": 1024, "gradient_checkpointing": False, "failure": "OutOfMemoryError: CUDA"}]
    main, sweep = report.configs_text(rows, 512).split("token budget sweep:")
    assert "packing off/on (budget 512)" in main
    assert [line.split()[:2] for line in main.splitlines() if line and line[0] in "o5"] == [
        ["off", "off"], ["512", "off"], ["512", "on"]]  # 256 is in the sweep only
    assert len(lines_of(sweep, "256")) == 1 and len(lines_of(sweep, "512")) == 2 and not lines_of(sweep, "off")
    failed = lines_of(sweep, "1024")[0]
    assert "OutOfMemoryError: CUDA" in failed
    assert "12,346" in main and "12.3" in main and " - " in main  # thousands, one decimal, '-' for no value


def test_attention_and_exactness_say_no_plainly_and_show_failures():
    ok = {"call": "varlen", "backend": "sdpa", "failure": None, "forward_s": 0.0012, "forward_backward_s": 0.0036,
          "tflops_forward": 300.0, "tflops_forward_backward": 310.0, "error_out": 1e-3, "error_grad": 2e-2,
          "exact": False}
    text = report.attention_text([ok, {"call": "varlen", "backend": "flash", "failure": "no flash-attn"}])
    assert "1.20" in text and "3.60" in text and "1.0e-03" in text and lines_of(text, "varlen")[0].endswith("NO")
    assert "no flash-attn" in lines_of(text, "varlen")[1]
    check = {"microbatches": 3, "token_budget": 128, "tokens": 300, "fp32_loss": 0.5,
             "rows": [{"switches": "bf16", "loss": 0.5000001, "vs_fp32": {"loss": 1e-7, "grad": 1e-3},
                       "vs_today": {"loss": 0.0, "grad": 0.0}, "tolerance": {"loss": 1e-2, "grad": 5e-2},
                       "exact": True},
                      {"switches": "liger", "skipped": "liger: need a CUDA device"}]}
    text = report.exactness_text(check)
    assert "3 rows at 128, 300 tokens" in text and "loss 0.500000" in text
    assert lines_of(text, "bf16")[0].endswith("yes") and "1.0e-02, 5.0e-02" in text
    assert "need a CUDA device" in lines_of(text, "liger")[0]


def test_the_breakdown_is_empty_without_a_profiled_row_and_per_microbatch_otherwise():
    assert report.breakdown_text([{"switches": "today"}]) == ""
    profiled = {"switches": "compile", "breakdown": {"per_microbatch_s": {"matmul": 0.010, "attention": 0.002},
                                                     "share": {"matmul": 0.5, "attention": 0.1},
                                                     "wall_s": 0.08, "microbatches": 4}}
    text = report.breakdown_text([{"switches": "today"}, profiled])
    assert "compile ms (%)" in text and "10.0 (50 %)" in text and "2.0 (10 %)" in text
    assert lines_of(text, "wall")[0].split() == ["wall", "20.0"]


def test_the_whole_report_carries_only_the_parts_it_has():
    base = {"versions": {"torch": "2.9", "trl": "1.16"}, "device": "cpu", "machine": "aarch64", "date": "2026-12-01",
            "profile": "cpu", "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj"]}, "workload": "seed004",
            "peak_tflops": None, "matmul_tflops": 1.234, "attention_backend": "auto", "attention_choices": {}}
    text = report.report_text(base)
    assert text.startswith("device: cpu on aarch64 (torch 2.9, trl 1.16), 2026-12-01")
    assert "peak - TFLOP/s" in text and "-> fixed" in text and text.endswith(report.FORMULAS)
    assert "attention paths" not in text and "token budget sweep" not in text and "fastest" not in text
    best = config_row(512, True, peak_gib=30.25)
    full = report.report_text({**base, "configs": [config_row(0, False), best], "token_budget": 512,
                               "best_budget": best})
    assert "token budget sweep" in full
    assert "budget 512, checkpointing on: 12,346 tok/s, peak 30.2 GiB" in full
