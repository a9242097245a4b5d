"""verl's `verl.plugins` entry point for the kit: verl imports it (not calls it) while verl itself is imported, so
importing this module is the registration (grpo_deploy.runtime.verl.cpu.register). verl swallows a plugin's failure
at debug level; this module says it on stderr instead, so a rehearsal that cannot get its platform says why."""

from __future__ import annotations

import sys

from grpo_deploy.runtime.verl.cpu import register

try:
    register()
except Exception as exc:  # noqa: BLE001 - verl would hide it; the run would then fail far from the cause
    print(f"grpo-deploy: the verl CPU platform was not registered: {type(exc).__name__}: {exc}", file=sys.stderr)
