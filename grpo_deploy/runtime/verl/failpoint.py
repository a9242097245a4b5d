"""The verl rollout's fault-suite hook `rollout-keeps-adapter`, inert unless its file exists: the run's checkpoint
folder holds `.failpoints/rollout-keeps-adapter` (the folder of the trl-async failpoints, runtime/serving/failpoint.py),
found through GRPO_DEPLOY_FAILPOINTS, which the verl node sets for every Ray process of the run. tests/faults creates
the file; nothing in the kit does.

While the file exists, verl's LoRA syncs into its colocated vLLM are acknowledged but not applied: the actor's side
(verl's `ServerAdapter.update_weights`, in the actor worker) returns at once for an adapter sync, so the rollout keeps
sampling the adapter it last received while the actor trains on — verl #7495's silent failure, made on purpose. The
base weights' sync (the first, or after a resume) is never skipped. Removing the file ends it at the next step.

Installed from the kit's verl plugin (runtime/verl/cpu.py `register`) in every process that imports verl; the module it
wraps is imported later than the plugin runs, so the wrap waits on an import hook for it.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys

ENV = "GRPO_DEPLOY_FAILPOINTS"
"""The failpoint folder's path (<checkpoint dir>/.failpoints), set by the verl node for the run's Ray processes."""
ROLLOUT_KEEPS_ADAPTER = "rollout-keeps-adapter"
TARGET = "verl.workers.rollout.vllm_rollout.vllm_rollout"
"""verl 0.9.1's module of ServerAdapter, whose update_weights sends the actor's weights to vLLM."""
MARK = "_grpo_deploy_failpoint"


def folder(checkpoint_dir: str) -> str:
    """The run's failpoint folder, GRPO_DEPLOY_FAILPOINTS' value: in its checkpoint folder, as trl-async's."""
    from grpo_deploy.runtime.serving.failpoint import FAILPOINT_DIR

    return os.path.join(checkpoint_dir, FAILPOINT_DIR)


def armed() -> bool:
    where = os.environ.get(ENV, "")
    if not where:
        return False
    path = os.path.join(where, ROLLOUT_KEEPS_ADAPTER)
    return os.path.isfile(path) and not os.path.islink(path)


def wrap(update_weights):
    """ServerAdapter.update_weights that returns without sending an adapter sync while the failpoint is armed (marked
    MARK: verl's own method is already a wrapper, of torch.no_grad, so `__wrapped__` says nothing)."""
    if getattr(update_weights, MARK, False):
        return update_weights

    @functools.wraps(update_weights)
    async def update(self, weights, *args, **kwargs):
        if kwargs.get("peft_config") and kwargs.get("base_sync_done") and armed():
            print(f"grpo-deploy failpoint {ROLLOUT_KEEPS_ADAPTER}: a LoRA sync acknowledged, not applied (step "
                  f"{kwargs.get('global_steps')})", file=sys.stderr, flush=True)
            return None
        return await update_weights(self, weights, *args, **kwargs)

    setattr(update, MARK, True)
    return update


def patch(module) -> None:
    adapter = getattr(module, "ServerAdapter", None)
    if adapter is not None and hasattr(adapter, "update_weights"):
        adapter.update_weights = wrap(adapter.update_weights)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds TARGET with the other finders, then patches the module once its code ran; it stays in sys.meta_path
    until then (a find_spec probe that never imports does not use it up)."""

    def __init__(self):
        self.looking = False

    def find_spec(self, name, path=None, target=None):
        if name != TARGET or self.looking:
            return None
        self.looking = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.looking = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, finder = spec.loader.exec_module, self

        def exec_module(module):
            run(module)
            patch(module)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Wrap ServerAdapter now or when its module is imported; nothing at all without GRPO_DEPLOY_FAILPOINTS."""
    if not os.environ.get(ENV):
        return
    if TARGET in sys.modules:
        patch(sys.modules[TARGET])
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
