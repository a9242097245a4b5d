"""The deployment spec, the user's file -> Resolved: schema (the models), load (file:line problems), rules (the
cross-field checks), yamlpos, profiles, resolve, new_spec. This face re-exports what callers read a spec with."""

from __future__ import annotations

from grpo_deploy.spec.load import load, loads, parse, secret_values
from grpo_deploy.spec.rules import check_consistency
from grpo_deploy.spec.schema import DeploymentSpec, HostSpec, LoadedSpec, Problem, SpecError, key_str

__all__ = ["DeploymentSpec", "HostSpec", "LoadedSpec", "Problem", "SpecError", "check_consistency", "key_str", "load",
           "loads", "parse", "secret_values"]
