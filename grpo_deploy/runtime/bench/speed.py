"""The speed-switch part of `bench trainer`: each switch combination (trainer_speed.py) timed on the packed step with
its compile seconds and recompiles, its loss and LoRA gradients against today's path and an fp32 reference on one
batch (exactness), and the step breakdown by kernel class (step_profile.py)."""

from __future__ import annotations

import json
import math
import sys

from grpo_deploy.runtime.bench import flops, step_profile
from grpo_deploy.runtime.bench.packed_step import build_policy, measure, summarise, train_microbatch, trl_loss_state
from grpo_deploy.runtime.bench.synthetic_rollouts import microbatches
from grpo_deploy.runtime.trainer import speed as trainer_speed

# Within bf16 rounding: a switch's error against the fp32 reference is at most twice today's, or bf16's unit
# roundoff (2^-8) where today's is smaller than that.
BF16_ROUNDOFF = 2.0**-8
LORA_B_STD = 0.02  # PEFT starts B at zero (A's gradient would be zero): the check gives B seeded random values


def speed_rows(arch, model_path, profile, samples, budget, device, peak, rows: list[trainer_speed.Switches],
               breakdown: set[str], check: dict | None = None, breakdown_batches: int = 2) -> list[dict]:
    """Time each switch combination on the packed step without checkpointing (a fresh policy and a cold compiler
    each); a combination that cannot run here is a row with `skipped` and the reason. With `check` (batches and the
    fp32 reference), each timed policy also runs the exactness step, its compiled code already warm; the results
    collect in check["rows"]."""
    import torch

    batches = microbatches(samples, budget)
    results = []
    for switches in rows:
        reason = trainer_speed.unavailable_reason(switches, device, device == "cuda")
        row_head = {"switches": switches.label, "base_dtype": switches.base_dtype,
                    "fused_kernels": switches.fused_kernels, "compile_layers": switches.compile_layers}
        if reason:
            results.append({**row_head, "token_budget": budget, "skipped": reason})
            continue
        trainer_speed.reset_compiler()
        model = build_policy(arch, model_path, profile, False, device, switches)
        shape = flops.ModelShape.from_config(model.config)
        try:
            timing = measure(model, batches, device, warmup=3 if switches.compile_layers else 2)
        except torch.OutOfMemoryError:
            results.append({**row_head, "token_budget": budget, "failure": "out of memory"})
            model = None  # freed before the next row's policy is built
            torch.cuda.empty_cache()
            continue
        except Exception as error:  # a switch that breaks here is a row that says how, not a lost report
            results.append({**row_head, "token_budget": budget, "failure": f"{type(error).__name__}: {error}"[:300]})
            print("speed row failed:", switches.label, repr(error)[:2000], file=sys.stderr, flush=True)
            model = None  # freed before the next row's policy is built
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        row = summarise(switches.label, budget, False, batches, timing, shape, profile.lora.r, len(samples), peak)
        row.update(row_head, compile_s=timing["compile_s"], warmup_s=timing["warmup_s"],
                   graphs_warmup=timing["graphs_warmup"], recompiles_in_step=timing["recompiles_in_step"],
                   microbatch_s=timing["microbatch_s"], host_microbatch_s=timing["host_microbatch_s"])
        if switches.label in breakdown:
            state = trl_loss_state(len(batches), device)
            row["breakdown"] = step_profile.profile_microbatches(
                lambda b, model=model, state=state: train_microbatch(model, state, b, device),
                batches[:breakdown_batches], device,
                profile.lora.r)
            model.zero_grad(set_to_none=True)
        if check is not None and switches != trainer_speed.Switches():
            verdict = check_row(switches.label, model, check["batches"], device, check["reference"], check["today"])
            check["today"] = check["today"] or verdict["_today"]
            check["rows"].append(verdict)
            print("check row:", json.dumps({k: v for k, v in verdict.items() if k != "_today"}), file=sys.stderr,
                  flush=True)
        results.append(row)
        print("speed row:", json.dumps({k: v for k, v in row.items() if k != "breakdown"}), file=sys.stderr,
              flush=True)
        model = None
        if device == "cuda":
            torch.cuda.empty_cache()
    return results


def _seed_lora_b(model, seed: int = 1) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if "lora_B" in name:
            values = torch.randn(param.shape, generator=generator) * LORA_B_STD
            param.data.copy_(values.to(param.device, param.dtype))


def step_result(model, batches, device: str, autocast: bool) -> tuple[float, object]:
    """Loss (summed over the microbatches, as accumulation sums them) and the LoRA gradients, flattened in float64."""
    import torch

    state = trl_loss_state(len(batches), device)
    model.zero_grad(set_to_none=True)
    loss = sum(float(train_microbatch(model, state, batch, device, autocast)) for batch in batches)
    grads = [p.grad.detach().double().flatten().cpu() for n, p in sorted(model.named_parameters())
             if p.requires_grad and "lora_" in n]
    model.zero_grad(set_to_none=True)
    return loss, torch.cat(grads)


def _errors(loss, grads, ref_loss, ref_grads) -> dict:
    return {"loss": abs(loss - ref_loss) / max(abs(ref_loss), 1e-12),
            "grad": float((grads - ref_grads).norm() / ref_grads.norm().clamp(min=1e-30))}


def reference_step(arch, model_path, profile, batches, device) -> tuple[float, object]:
    """The check step in fp32 without autocast (attention through the shim's SDPA path), seeded LoRA B."""
    reference = build_policy(arch, model_path, profile, False, device, None)
    _seed_lora_b(reference)
    result = step_result(reference, batches, device, autocast=False)
    del reference
    return result


def check_row(label: str, model, batches, device: str, reference, today) -> dict:
    """One policy's loss and LoRA gradients on the check step under bf16 autocast, against the fp32 reference and
    today's path (`today` None: this is today's path); exact when within bf16 rounding of the reference."""
    _seed_lora_b(model)
    loss, grads = step_result(model, batches, device, autocast=True)
    row = {"switches": label, "loss": loss, "vs_fp32": _errors(loss, grads, *reference)}
    base = today or (loss, grads, row["vs_fp32"])
    row["vs_today"] = _errors(loss, grads, base[0], base[1])
    row["tolerance"] = {k: max(2 * base[2][k], BF16_ROUNDOFF) for k in ("loss", "grad")}
    row["exact"] = all(math.isfinite(row["vs_fp32"][k]) and row["vs_fp32"][k] <= row["tolerance"][k]
                       for k in ("loss", "grad"))
    row["_today"] = (loss, grads, row["vs_fp32"]) if today is None else None
    return row


def check_today(arch, model_path, profile, device, check: dict) -> None:
    """Today's path on the check step (a fresh eager policy): the row every switch is compared with."""
    model = build_policy(arch, model_path, profile, False, device, trainer_speed.Switches())
    row = check_row("today", model, check["batches"], device, check["reference"], None)
    check["today"] = row["_today"]
    check["rows"].append(row)


def check_batches(samples, budget: int, count: int = 2) -> list[dict]:
    return microbatches(samples, budget)[:count]


def exactness(arch, model_path, profile, samples, budget, device, rows: list[trainer_speed.Switches]) -> dict:
    """Loss and LoRA gradients of one packed step (the first two rows at `budget`) for today's path and each switch
    combination under bf16 autocast (CUDA or CPU), against the same step in fp32 without autocast; same weights, same
    seeded LoRA B, same batch. Each combination on a fresh policy."""
    import torch

    batches = check_batches(samples, budget)
    reference = reference_step(arch, model_path, profile, batches, device)
    results, today = [], None
    for switches in [trainer_speed.Switches(), *[r for r in rows if r != trainer_speed.Switches()]]:
        reason = trainer_speed.unavailable_reason(switches, device, autocast=True)
        if reason:
            results.append({"switches": switches.label, "skipped": reason})
            continue
        model = build_policy(arch, model_path, profile, False, device, switches, autocast=True)
        try:
            row = check_row(switches.label, model, batches, device, reference, today)
        except Exception as error:  # as in speed_rows: a switch that breaks here is a row that says how
            results.append({"switches": switches.label, "failure": f"{type(error).__name__}: {error}"[:300]})
            print("check row failed:", switches.label, repr(error)[:2000], file=sys.stderr, flush=True)
            model = None
            continue
        today = today or row["_today"]
        results.append(row)
        model = None
        if device == "cuda":
            torch.cuda.empty_cache()
    return exactness_report(budget, batches, reference, results)


def exactness_report(budget, batches, reference, rows) -> dict:
    return {"token_budget": budget, "microbatches": len(batches),
            "tokens": sum(int(b["attention_mask"].sum()) for b in batches), "fp32_loss": reference[0],
            "rows": [{k: v for k, v in r.items() if k != "_today"} for r in rows]}
