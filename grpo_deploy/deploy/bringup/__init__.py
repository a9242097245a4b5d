"""Each engine's bring-up on its hosts, one module per engine under the same function names — hosts (where it starts
containers), addresses and addresses_words (what the deployer resolves on the hosts for the render: the server's
published IP, each Ray node's address; and its words for the progress line), start (its roles in order, up to
ready), follow (progress per step until the main role exits: its exit code, or RoleDied for supervision), restart (a
role that died), after_failure (what a failed run leaves to look at) — each declaring the engine it serves (ENGINE),
and the table that finds a run's (BRINGUP); what they share is in grpo_deploy.deploy.bringup.base. The deployer
(grpo_deploy.deploy.lifecycle) runs everything before and after."""

from __future__ import annotations

from types import ModuleType

from grpo_deploy.deploy.bringup import trl_async, verl

BRINGUP: dict[str, ModuleType] = {module.ENGINE: module for module in (trl_async, verl)}
"""Engine name -> its bring-up module."""

