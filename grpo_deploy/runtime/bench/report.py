"""Plain-text tables of a `bench trainer` report: attention paths, the four configurations, the budget sweep."""

from __future__ import annotations

from grpo_deploy.common.table import table


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


def speed_text(rows: list[dict]) -> str:
    """One row per speed-switch combination: time, MFU, compile cost and recompiles, memory."""
    headers = ["switches", "budget", "s/step", "tok/s", "peak GiB", "MFU 6N", "MFU LoRA", "MFU TRL", "compile s",
               "graphs", "recompiles in step"]
    lines = []
    for r in rows:
        if "skipped" in r or "failure" in r:
            lines.append([r["switches"], r["token_budget"], r.get("skipped") or r["failure"], *[""] * 8])
            continue
        lines.append([r["switches"], r["token_budget"], _fmt(r["seconds"], ".2f"), _fmt(r["tokens_per_s"], ",.0f"),
                      _fmt(r["peak_gib"], ".1f"), _fmt(r["mfu_model"], ".1f"), _fmt(r["mfu_lora"], ".1f"),
                      _fmt(r["mfu_trl"], ".1f"), _fmt(r["compile_s"], ".1f"), r["graphs_warmup"],
                      r["recompiles_in_step"]])
    return table(headers, lines, 200)


def breakdown_text(rows: list[dict]) -> str:
    """Milliseconds per microbatch by kernel class for each profiled speed row, with shares of the wall time."""
    profiled = [r for r in rows if "breakdown" in r]
    if not profiled:
        return ""
    classes = list(profiled[0]["breakdown"]["per_microbatch_s"])
    headers = ["class", *[f"{r['switches']} ms (%)" for r in profiled]]
    lines = [[c, *[f"{r['breakdown']['per_microbatch_s'][c] * 1e3:.1f} ({r['breakdown']['share'][c] * 100:.0f} %)"
                   for r in profiled]] for c in classes]
    walls = [r["breakdown"]["wall_s"] / r["breakdown"]["microbatches"] * 1e3 for r in profiled]
    lines.append(["wall", *[f"{w:.1f}" for w in walls]])
    return "per microbatch, by kernel class (torch profiler):\n" + table(headers, lines, 200)


def exactness_text(check: dict) -> str:
    headers = ["switches", "loss", "loss err vs fp32", "grad err vs fp32", "loss err vs today", "grad err vs today",
               "tolerance (loss, grad)", "exact"]
    lines = []
    for r in check["rows"]:
        if "skipped" in r or "failure" in r:
            lines.append([r["switches"], r.get("skipped") or r["failure"], *[""] * 6])
            continue
        lines.append([r["switches"], _fmt(r["loss"], ".6f"), _fmt(r["vs_fp32"]["loss"], ".1e"),
                      _fmt(r["vs_fp32"]["grad"], ".1e"), _fmt(r["vs_today"]["loss"], ".1e"),
                      _fmt(r["vs_today"]["grad"], ".1e"),
                      f"{r['tolerance']['loss']:.1e}, {r['tolerance']['grad']:.1e}", "yes" if r["exact"] else "NO"])
    return (f"exactness: one packed step ({check['microbatches']} rows at {check['token_budget']}, "
            f"{check['tokens']} tokens), bf16 autocast vs the same step in fp32 (loss {check['fp32_loss']:.6f}); "
            "relative errors, LoRA gradients as one vector:\n" + table(headers, lines, 200))


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
    machine = f" on {report['machine']}" if report.get("machine") else ""
    head = [f"device: {report['device']}{machine} ({versions_line}), {report['date']}",
            f"profile {report['profile']}: LoRA r={report['lora']['r']} alpha={report['lora']['alpha']} "
            f"targets={report['lora']['target_modules']}; workload {report['workload']}",
            f"peak {_fmt(report['peak_tflops'], '.0f')} TFLOP/s, measured bf16 matmul "
            f"{_fmt(report['matmul_tflops'], '.0f')} TFLOP/s; attention backend {report['attention_backend']} "
            f"-> {report['attention_choices'] or 'fixed'}"]
    parts = ["\n".join(head)]
    if "attention" in report:
        parts.append("attention paths (bf16 vs fp32 reference; fwd+bwd FLOPs = 3 x forward):\n"
                     + attention_text(report["attention"]))
    if "configs" in report:
        parts.append(configs_text(report["configs"], report["token_budget"]))
    if report.get("speed"):
        parts.append("speed switches (packed, checkpointing off; compile s = warm-up beyond steady time, graphs = "
                     "Dynamo graphs compiled in warm-up):\n" + speed_text(report["speed"]))
        if breakdown_text(report["speed"]):
            parts.append(breakdown_text(report["speed"]))
    if report.get("exactness"):
        parts.append(exactness_text(report["exactness"]))
    best = report.get("best_budget")
    if best:
        parts.append(f"fastest packed configuration within memory: budget {best['token_budget']}, checkpointing "
                     f"{'on' if best['gradient_checkpointing'] else 'off'}: {best['tokens_per_s']:,.0f} tok/s, "
                     f"peak {_fmt(best['peak_gib'], '.1f')} GiB")
    parts.append(FORMULAS)
    return "\n\n".join(parts)
