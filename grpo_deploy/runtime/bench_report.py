"""Plain-text tables of a `bench trainer` report: attention paths, the four configurations, the budget sweep."""

from __future__ import annotations

from .table import table


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def configs_text(rows: list[dict], budget: int) -> str:
    """The four main configurations, then the budget sweep, as plain tables."""
    headers = ["budget", "ckpt", "s/step", "tok/s", "trained tok/s", "samples/h", "peak GiB", "MFU 6N", "MFU LoRA",
               "MFU TRL"]
    lines = []
    for row in rows:
        if "failure" in row:
            lines.append([row["token_budget"] or "off", "on" if row["gradient_checkpointing"] else "off",
                          row["failure"], "", "", "", "", "", "", ""])
            continue
        lines.append([row["token_budget"] or "off", "on" if row["gradient_checkpointing"] else "off",
                      _fmt(row["seconds"], ".2f"), _fmt(row["tokens_per_s"], ",.0f"),
                      _fmt(row["trained_tokens_per_s"], ",.0f"), _fmt(row["samples_per_hour"], ",.0f"),
                      _fmt(row["peak_gib"], ".1f"), _fmt(row["mfu_model"], ".1f"), _fmt(row["mfu_lora"], ".1f"),
                      _fmt(row["mfu_trl"], ".1f")])
    main = [line for line, row in zip(lines, rows, strict=True) if row["token_budget"] in (0, budget)]
    sweep = [line for line, row in zip(lines, rows, strict=True) if row["token_budget"] > 0]
    return (f"packing off/on (budget {budget}) x gradient checkpointing, fwd+bwd:\n" + table(headers, main, 200)
            + "\n\ntoken budget sweep:\n" + table(headers, sweep, 200))


def attention_text(results: list[dict]) -> str:
    headers = ["call", "backend", "fwd ms", "fwd+bwd ms", "fwd TFLOP/s", "fwd+bwd TFLOP/s", "err out", "err grad",
               "exact"]
    lines = []
    for r in results:
        if r["failure"]:
            lines.append([r["call"], r["backend"], "", "", "", "", "", "", r["failure"]])
            continue
        lines.append([r["call"], r["backend"], _fmt(r["forward_s"] * 1e3, ".2f"),
                      _fmt(r["forward_backward_s"] * 1e3, ".2f"), _fmt(r["tflops_forward"], ".0f"),
                      _fmt(r["tflops_forward_backward"], ".0f"), _fmt(r["error_out"], ".1e"),
                      _fmt(r["error_grad"], ".1e"), "yes" if r["exact"] else "NO"])
    return table(headers, lines, 200)


FORMULAS = """\
MFU 6N   = (6 x decoder linear params x forwarded tokens + 6 x hidden x vocab x trained tokens
            + 3 x attention forward) / s / peak; attention forward = 4 x heads x head_dim x causal pairs x layers
MFU LoRA = the FLOPs LoRA really executes: 4x instead of 6x for frozen weights (no weight gradient),
           + 6 x LoRA params x tokens, same attention term
MFU TRL  = TRL 1.16 perf/mfu_fwd_bwd (the 3.9%/19% of the H200 field run): 6N with the LM head on every
           forwarded token and non-causal attention over the mean sample length
peak     = dense bf16 of the device (H200/H100 SXM 989 TFLOP/s: NVIDIA datasheet 1,979 with sparsity, halved;
           TRL's table). Checkpointing's recomputation is not counted. samples/h = completions / s x 3600."""


def report_text(report: dict) -> str:
    """Everything `collect` measured, as the tables the CLI prints."""
    versions_line = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    head = [f"device: {report['device']} ({versions_line}), {report['date']}",
            f"profile {report['profile']}: LoRA r={report['lora']['r']} alpha={report['lora']['alpha']} "
            f"targets={report['lora']['target_modules']}; workload {report['workload']}",
            f"peak {_fmt(report['peak_tflops'], '.0f')} TFLOP/s, measured bf16 matmul "
            f"{_fmt(report['matmul_tflops'], '.0f')} TFLOP/s; attention backend {report['attention_backend']} "
            f"-> {report['attention_choices'] or 'fixed'}"]
    parts = ["\n".join(head)]
    if "attention" in report:
        parts.append("attention paths (bf16 vs fp32 reference; fwd+bwd FLOPs = 3 x forward):\n"
                     + attention_text(report["attention"]))
    parts.append(configs_text(report["configs"], report["token_budget"]))
    best = report["best_budget"]
    if best:
        parts.append(f"fastest packed configuration within memory: budget {best['token_budget']}, checkpointing "
                     f"{'on' if best['gradient_checkpointing'] else 'off'}: {best['tokens_per_s']:,.0f} tok/s, "
                     f"peak {_fmt(best['peak_gib'], '.1f')} GiB")
    parts.append(FORMULAS)
    return "\n\n".join(parts)
