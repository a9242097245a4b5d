"""Preflight: named checks, each reading a fact and giving a verdict and a fix hint, over one host session.

Layout: `session` (connectors, facts read once, the local engine's client, the plan), `registry` (verdicts, `@check`
with what each check needs, the runner, table and JSON), and the checks by what they look at: `spec`, `host`,
`storage`, `images`, `ray` (a Ray cluster across hosts).
Importing this package registers every check, in registry.ORDER.
"""

from grpo_deploy.preflight import cluster, host, images, spec, storage  # noqa: F401  (registers the checks)
from grpo_deploy.preflight.images import TRL_VLLM_GATE, image_on
from grpo_deploy.preflight.registry import (
           CHECKS,
           EXIT_COULD_NOT_RUN,
           EXIT_FAILED,
           EXIT_OK,
           FAIL,
           OK,
           SKIP,
           WARN,
           Check,
           Result,
           after_shipping,
           before_shipping,
           check,
           exit_code,
           names,
           run_checks,
           table_text,
           to_json,
)
from grpo_deploy.preflight.session import Context, checkpoint_free_space, image_roles, measured_free_space
from grpo_deploy.preflight.storage import checkpoint_headroom, headroom_text

__all__ = ["CHECKS", "EXIT_COULD_NOT_RUN", "EXIT_FAILED", "EXIT_OK", "FAIL", "OK", "SKIP", "TRL_VLLM_GATE", "WARN",
           "Check", "Context", "Result", "after_shipping", "before_shipping", "check", "checkpoint_free_space",
           "checkpoint_headroom", "exit_code", "headroom_text", "image_on", "image_roles", "measured_free_space",
           "names", "run_checks", "table_text", "to_json"]
