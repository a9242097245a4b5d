"""`grpo-deploy bench trainer`: TRL's packed GRPO forward/backward on a LoRA policy with synthetic rollouts.

Measures tokens/s, trained tokens/s, peak memory and MFU for packing off/on x gradient checkpointing on/off, sweeps the
token budget, and times every attention path of the shim. Runs inside a trainer image
(`python3 -m grpo_deploy.runtime.bench.trainer`) on any CUDA GPU, or on CPU with `--tiny` in seconds.

What runs is TRL 1.16's own code: its planners (`FixedCountBatcher` for packing off, `TokenBudgetBatcher` for packing
on), its collator (`DataCollatorForRollout`: tree packing, position ids, cu_seqlens), the model loaded with TRL's
`tree_fa3` attention (routed to our shim) and fused log-prob head, and `AsyncGRPOTrainer.compute_loss` called on a
stand-in for the trainer object that carries the attributes it reads. What differs from a training step: no rollout
worker or vLLM (the samples are synthetic), no optimizer step (TRL's `perf/fwd_bwd_s` excludes it too), one process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time

from grpo_deploy.runtime.bench import flops
from grpo_deploy.runtime.bench import speed as bench_speed
from grpo_deploy.runtime.bench.packed_step import build_policy, measure, summarise
from grpo_deploy.runtime.bench.report import report_text
from grpo_deploy.runtime.bench.synthetic_rollouts import (
    QWEN25_15B,
    TINY,
    Profile,
    load_profile,
    microbatches,
    seed_004_workload,
    synthetic_rollouts,
)
from grpo_deploy.runtime.trainer import speed as trainer_speed
from grpo_deploy.runtime.trainer.config import ATTENTION_BACKENDS


def run_config(model, samples, budget, checkpointing, device, shape, rank, peak) -> dict:
    """Pack, measure and summarise one configuration; an out-of-memory run is a row with `failure`."""
    import torch

    name = f"packing {'on' if budget > 0 else 'off'}, checkpointing {'on' if checkpointing else 'off'}"
    batches = microbatches(samples, budget)
    try:
        timing = measure(model, batches, device)
    except torch.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return {"config": name, "token_budget": budget, "gradient_checkpointing": checkpointing,
                "failure": "out of memory"}
    return summarise(name, budget, checkpointing, batches, timing, shape, rank, len(samples), peak)


def best_budget(rows: list[dict]) -> dict | None:
    """The packed configuration with the highest forwarded tokens/s among those that fit in memory."""
    fitted = [r for r in rows if "failure" not in r and r["token_budget"] > 0]
    return max(fitted, key=lambda r: r["tokens_per_s"]) if fitted else None


def matmul_ceiling(device: str, size: int = 8192) -> float | None:
    """Measured bf16 matrix-product rate (TFLOP/s) on random data: the achievable ceiling beside the datasheet."""
    import torch

    if device != "cuda":
        return None
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * 10 / (time.perf_counter() - started) / 1e12


def attention_paths(shape, samples: list[dict], budget: int, device: str) -> list[dict]:
    """Every shim backend on two packed calls (error vs fp32 reference, forward and fwd+bwd TFLOP/s): a trainer row
    (the first microbatch at `budget`, tree layout) and 4 segments of budget/4 tokens (plain causal)."""
    import torch

    from grpo_deploy.runtime.trainer import attention_shim

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    row = microbatches(samples, budget)[0]
    cu_q = row["tree_cu_seqlens_q"][0][row["tree_cu_seqlens_q"][0] >= 0].to(device)
    cu_k = row["tree_cu_seqlens_k"][0][row["tree_cu_seqlens_k"][0] >= 0].to(device)
    kv_index = row["tree_kv_index"][0][row["tree_kv_index"][0] >= 0].to(device)
    quarter = budget // 4
    plain = torch.arange(0, budget + 1, quarter, dtype=torch.int32, device=device)
    calls = {"trainer row": (cu_q, cu_k, kv_index), f"4 x {quarter}-token segments": (plain, plain, None)}
    results = []
    generator = torch.Generator(device).manual_seed(0)
    for label, (cq, ck, index) in calls.items():
        total = int(cq[-1])
        q, k, v = (torch.randn(total, h, shape.head_dim, device=device, generator=generator).to(dtype)
                   for h in (shape.heads, shape.kv_heads, shape.kv_heads))
        if index is not None:
            k, v = k.index_select(0, index), v.index_select(0, index)
        pairs = flops.causal_pairs(cq.tolist(), ck.tolist())
        forward = flops.attention_flops(shape.heads, shape.head_dim, pairs)
        backends = ("sdpa", *attention_shim.FAST_CANDIDATES)
        max_k, scale = int((ck[1:] - ck[:-1]).max()), 1 / math.sqrt(shape.head_dim)
        trials = attention_shim.compare(q, k, v, cq, ck, max_k, scale, backends)
        for trial in trials:
            result = {"call": label, "tokens": total, "pairs": pairs, **dataclasses.asdict(trial), "exact": trial.exact}
            if trial.failure is None:
                result["tflops_forward"] = forward / trial.forward_s / 1e12
                result["tflops_forward_backward"] = 3 * forward / trial.forward_backward_s / 1e12
            results.append(result)
    return results


def versions() -> dict:
    import importlib.metadata as metadata

    import torch

    found = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "trl", "peft", "accelerate", "liger_kernel", "triton"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def run_trainer_configs(arch, model_path, profile, samples, budgets, device, peak) -> list[dict]:
    """The four configurations (packing off/on x checkpointing on/off) and the budget sweep, one model build per
    checkpointing setting; budgets go up until one runs out of memory."""
    import torch

    rows = []
    for checkpointing in (False, True):
        model = build_policy(arch, model_path, profile, checkpointing, device)
        shape = flops.ModelShape.from_config(model.config)
        for budget in [0, *budgets]:
            row = run_config(model, samples, budget, checkpointing, device, shape, profile.lora.r, peak)
            rows.append(row)
            if "failure" in row:
                break
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def collect(args: argparse.Namespace) -> dict:
    """Run everything the arguments ask for; returns the report (what `--json` prints)."""
    import torch

    from grpo_deploy.runtime.trainer import attention_shim

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    profile = load_profile(args.profile)
    arch = None if args.model else (TINY if args.tiny else QWEN25_15B)
    workload = seed_004_workload(profile, args.tiny, args.groups)
    budget = args.token_budget or (256 if args.tiny else profile.token_budget)
    budgets = sorted({budget, *(args.budgets or ([128, 512] if args.tiny else [8192, 32768, 65536]))})
    attention_shim.install("on", args.attention_backend)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = args.peak_tflops * 1e12 if args.peak_tflops else flops.peak_flops(name)
    vocab = arch["vocab_size"] if arch else _vocab_of(args.model)
    samples = synthetic_rollouts(workload, vocab)
    report = {"date": time.strftime("%Y-%m-%d"), "device": name, "machine": platform.machine(), "versions": versions(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "profile": profile.name,
              "lora": vars(profile.lora), "workload": dataclasses.asdict(workload),
              "peak_tflops": peak / 1e12 if peak else None, "matmul_tflops": matmul_ceiling(device),
              "attention_backend": args.attention_backend, "token_budget": budget}
    if arch:
        report["model"] = dict(flops.ModelShape(arch["hidden_size"], arch["num_hidden_layers"],
                                                arch["num_attention_heads"], arch["num_key_value_heads"],
                                                arch["hidden_size"] // arch["num_attention_heads"],
                                                arch["intermediate_size"], arch["vocab_size"]).__dict__)
    if not args.skip_attention and arch:
        shape = flops.ModelShape(**report["model"])
        report["attention"] = attention_paths(shape, samples, budget, device)
    if not args.speed_only:
        report["configs"] = run_trainer_configs(arch, args.model, profile, samples, budgets, device, peak)
        report["best_budget"] = best_budget(report["configs"])
    report.update(speed_report(args, arch, profile, samples, budget, device, peak))
    report["attention_choices"] = {str(k): v for k, v in attention_shim.SHIM.choices.items()}
    return report


def speed_rows_of(args: argparse.Namespace, profile: Profile) -> list[trainer_speed.Switches]:
    """The switch combinations to time: today's path, each switch alone, and the profile's own combination last."""
    if args.speed_rows:
        return [trainer_speed.Switches.parse(t) for t in args.speed_rows.split(";") if t.strip()]
    rows = [trainer_speed.Switches.parse(t) for t in ("today", "bf16-linear", "bf16", "liger", "compile")]
    chosen = trainer_speed.Switches(**(profile.speed or {}))
    return [r for r in rows if r != chosen or r == rows[0]] + ([chosen] if chosen != rows[0] else [])


def speed_report(args, arch, profile, samples, budget, device, peak) -> dict:
    """The speed-switch rows (at the main budget, the last also at `--speed-budgets`), the breakdown of the first and
    last rows, and the exactness of every row."""
    rows = speed_rows_of(args, profile)
    breakdown = set(args.breakdown.split(";")) if args.breakdown is not None else {"today", rows[-1].label}
    check_budget = args.exactness_budget or (128 if args.tiny else 4096)
    check = None
    if device == "cuda" and not args.skip_exactness:  # timed under autocast: each timed policy is checked in place
        batches = bench_speed.check_batches(samples, check_budget)
        check = {"batches": batches, "rows": [], "today": None,
                 "reference": bench_speed.reference_step(arch, args.model, profile, batches, device)}
        bench_speed.check_today(arch, args.model, profile, device, check)
    report = {"speed": bench_speed.speed_rows(arch, args.model, profile, samples, budget, device, peak, rows,
                                              breakdown, check)}
    for extra in args.speed_budgets or []:
        report["speed"] += bench_speed.speed_rows(arch, args.model, profile, samples, extra, device, peak, rows[-1:],
                                                  set())
    if check is not None:
        report["exactness"] = bench_speed.exactness_report(check_budget, check["batches"], check["reference"],
                                                           check["rows"])
    elif not args.skip_exactness:  # CPU times fp32: the bf16 checks build their own policies
        report["exactness"] = bench_speed.exactness(arch, args.model, profile, samples, check_budget, device, rows)
    return report


def _vocab_of(model_path: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path).vocab_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options, shared by `python3 -m grpo_deploy.runtime.bench.trainer` and `grpo-deploy bench trainer`."""
    parser.add_argument("--tiny", action="store_true", help="a tiny model and workload (CPU, seconds; CI)")
    parser.add_argument("--model", metavar="PATH", help="a real local model instead of Qwen2.5-1.5B-shaped random "
                                                        "weights")
    parser.add_argument("--profile", default="h200", help="hardware profile to read LoRA and token budget from")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    parser.add_argument("--groups", type=int, help="prompts of 8 completions each (default 16: one 128-completion "
                                                   "step)")
    parser.add_argument("--token-budget", type=int, help="packing budget of the four main configurations "
                                                         "(default: the profile's)")
    parser.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")],
                        help="comma-separated budgets to sweep (default 8192,32768,65536)")
    parser.add_argument("--attention-backend", default="fastest", choices=ATTENTION_BACKENDS, metavar="BACKEND",
                        help=f"shim backend for the trainer runs: {', '.join(ATTENTION_BACKENDS)} (default: fastest "
                             "exact one, picked at start-up)")
    parser.add_argument("--skip-attention", action="store_true", help="skip the attention-path table")
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak for MFU when the GPU is not in the table")
    parser.add_argument("--speed-only", action="store_true", help="only the speed-switch rows (no packing off/on x "
                                                                  "checkpointing table, no budget sweep)")
    parser.add_argument("--speed-rows", metavar="ROWS", help="';'-separated switch combinations to time, each "
                        "'today' or '+'-joined bf16-linear|bf16, liger, compile (default: today, each alone, the "
                        "profile's own)")
    parser.add_argument("--speed-budgets", type=lambda s: [int(x) for x in s.split(",")],
                        help="further budgets for the last speed row (comma-separated)")
    parser.add_argument("--breakdown", metavar="ROWS", help="';'-separated speed rows to profile by kernel class "
                                                            "(default: the first and the last; '' for none)")
    parser.add_argument("--exactness-budget", type=int, help="token budget of the exactness step (default 4096; "
                                                             "--tiny 128)")
    parser.add_argument("--skip-exactness", action="store_true", help="skip the loss/gradient exactness check")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    parser.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE")


def run(args: argparse.Namespace) -> int:
    """Collect, print, and optionally save the report; 0 when every main configuration ran."""
    report = collect(args)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    print(json.dumps(report, indent=2) if args.json else report_text(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.bench.trainer",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
