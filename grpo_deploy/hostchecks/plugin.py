"""The host checks' command-line options. pytest reads options only from plugins and from the conftest of a path given
on its command line; `--pyargs grpo_deploy.hostchecks` is not a path, so with --pyargs load this module first:
`pytest -p grpo_deploy.hostchecks.plugin --pyargs grpo_deploy.hostchecks ...` (the package's conftest then leaves the
options to it). Without it the options keep their defaults, which the environment can set."""

from __future__ import annotations

import os

DEFAULT_SPEC = "grpo-deploy.yaml"
DEFAULT_MAX_STEP_AGE_MIN = 15.0


def add_options(parser) -> None:
    group = parser.getgroup("grpo-deploy", "grpo-deploy host checks (expected values come from the spec)")
    group.addoption("--spec", metavar="FILE", default=os.environ.get("GRPO_DEPLOY_SPEC") or DEFAULT_SPEC,
                    help=f"deployment spec (default: $GRPO_DEPLOY_SPEC, else ./{DEFAULT_SPEC})")
    group.addoption("--run-checks", action="store_true", default=os.environ.get("GRPO_DEPLOY_RUN_CHECKS") == "1",
                    help="also check the running run: server healthy and listing the model, runtime LoRA loading, "
                         "trainer progressing, adapters readable by the server (default: $GRPO_DEPLOY_RUN_CHECKS=1)")
    group.addoption("--max-step-age", metavar="MINUTES", type=float, default=DEFAULT_MAX_STEP_AGE_MIN,
                    help="with --run-checks: the trainer's last step event may be at most this old "
                         f"(default {DEFAULT_MAX_STEP_AGE_MIN:g})")
    group.addoption("--accept-new-host-keys", action="store_true", default=False,
                    help="paramiko hosts: accept and save the key of a host not in known_hosts yet (a changed key is "
                         "still refused); without it an unknown key fails the host's checks")


def pytest_addoption(parser) -> None:
    add_options(parser)
