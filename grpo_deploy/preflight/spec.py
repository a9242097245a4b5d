"""Checks that read only the resolved spec and this machine's environment (no host is contacted): spec, memory (the
roles' memory on each host, plan's split), logger."""

from __future__ import annotations

from grpo_deploy.hosts import local_facts
from grpo_deploy.plan import memory_shortfalls, role_plans
from grpo_deploy.preflight.registry import FAIL, OK, SKIP, WARN, Result, check
from grpo_deploy.preflight.session import Context


@check("spec", "The spec validates and every cross-field rule holds")
def check_spec(ctx: Context) -> list[Result]:
    # Reaching this point means load + resolve succeeded; invalid specs never get a Context.
    res = ctx.res
    hosts = ", ".join(f"{h.name}({'+'.join(h.roles)})" for h in res.spec.hosts)
    return [Result("spec", "-", OK, f"{res.spec.engine} on {hosts}, shared volume at {res.spec.storage.mount}")]


@check("memory", "Each host's roles fit its GPU memory: vLLM's gpu_memory_utilization and the trainer's need (plan)")
def check_memory(ctx: Context) -> list[Result]:
    hosts = role_plans(ctx.res)
    short = memory_shortfalls(hosts)
    if short:
        return [Result("memory", s.host, FAIL, s.short, s.fix) for s in short]
    out = []
    for h in hosts:
        judged = [m for m in h.memory if m.get("fits") is not None]
        if not judged:
            out.append(Result("memory", h.host, SKIP, "; ".join(m.get("note", "no estimate") for m in h.memory)
                              or "no memory estimate for this engine"))
            continue
        words = [f"{m['role']} needs {m['need_gb']} of {m['available_gb']} GB" if "need_gb" in m else
                 f"{m['role']} {m['budget_gb']} GB (KV cache {m['kv_cache_gb']} GB)" if "budget_gb" in m else
                 f"{m['role']} fits" for m in judged]
        out.append(Result("memory", h.host, OK, f"{h.gpus}: {'; '.join(words)}"))
    return out


@check("logger", "Credentials for the chosen logger exist before any model is loaded")
def check_logger(ctx: Context) -> list[Result]:
    kind, env = ctx.res.spec.logger.kind, ctx.environ
    if kind == "wandb":
        mode = env.get("WANDB_MODE", "")
        if mode in ("offline", "disabled"):
            return [Result("logger", "-", OK, f"wandb in {mode} mode: no key needed")]
        if local_facts.env_set("WANDB_API_KEY", env) or local_facts.netrc_has("api.wandb.ai"):
            return [Result("logger", "-", OK, "W&B key found (WANDB_API_KEY or ~/.netrc); it is passed at start, "
                                              "never written to rendered files")]
        return [Result("logger", "-", FAIL,
                       "logger.kind is wandb but no W&B key: WANDB_API_KEY unset and no api.wandb.ai in ~/.netrc. "
                       "The trainer would load the model first and crash minutes later, after the GPUs were already "
                       "paid for",
                       "export WANDB_API_KEY=... (or run `wandb login`), or WANDB_MODE=offline, or logger.kind: jsonl")]
    if kind == "mlflow" and not local_facts.env_set("MLFLOW_TRACKING_URI", env):
        return [Result("logger", "-", WARN, "MLFLOW_TRACKING_URI unset: metrics go to a local sqlite file",
                       "export MLFLOW_TRACKING_URI=http://...")]
    return [Result("logger", "-", OK, f"logger {kind}: no credentials needed")]
