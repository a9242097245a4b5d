"""Checks that read only the resolved spec and this machine's environment (no host is contacted): spec, logger."""

from __future__ import annotations

from .. import facts
from .registry import FAIL, OK, WARN, Result, check
from .session import Context


@check("spec", "The spec validates and every cross-field rule holds")


def check_spec(ctx: Context) -> list[Result]:
    # Reaching this point means load + resolve succeeded; invalid specs never get a Context.
    res = ctx.res
    hosts = ", ".join(f"{h.name}({'+'.join(h.roles)})" for h in res.spec.hosts)
    return [Result("spec", "-", OK, f"{res.spec.engine} on {hosts}, shared volume at {res.spec.storage.mount}")]


@check("logger", "Credentials for the chosen logger exist before any model is loaded")


def check_logger(ctx: Context) -> list[Result]:
    kind, env = ctx.res.spec.logger.kind, ctx.environ
    if kind == "wandb":
        mode = env.get("WANDB_MODE", "")
        if mode in ("offline", "disabled"):
            return [Result("logger", "-", OK, f"wandb in {mode} mode: no key needed")]
        if facts.env_set("WANDB_API_KEY", env) or facts.netrc_has("api.wandb.ai"):
            return [Result("logger", "-", OK, "W&B key found (WANDB_API_KEY or ~/.netrc); it is passed at start, "
                                              "never written to rendered files")]
        return [Result("logger", "-", FAIL,
                       "logger.kind is wandb but no W&B key: WANDB_API_KEY unset and no api.wandb.ai in ~/.netrc. "
                       "The trainer would load the model first and crash minutes later, after the GPUs were already "
                       "paid for",
                       "export WANDB_API_KEY=... (or run `wandb login`), or WANDB_MODE=offline, or logger.kind: jsonl")]
    if kind == "mlflow" and not facts.env_set("MLFLOW_TRACKING_URI", env):
        return [Result("logger", "-", WARN, "MLFLOW_TRACKING_URI unset: metrics go to a local sqlite file",
                       "export MLFLOW_TRACKING_URI=http://...")]
    return [Result("logger", "-", OK, f"logger {kind}: no credentials needed")]
