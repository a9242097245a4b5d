"""The kit's CPU platform for verl 0.9.1 (the verl rehearsal on a machine without a GPU), loaded through verl's own
plugin entry point (`verl.plugins`), never a fork: a platform named `cpu` (gloo, the Ray resource `GPU` so that
logical GPUs satisfy verl's placement groups, no IPC so weights move through shared memory, no-op device calls), and
the one wrap verl needs on CPU (its process-group backend string `cpu:gloo,cpu:gloo` is refused by torch).

Inert unless asked for: the platform is only chosen with VERL_PLATFORM=cpu (its auto-detection answer is no), and the
wrap changes the backend only when that platform is the one in use; the vLLM name is added only where vLLM lacks it.
Imports nothing of verl until `register()`.
"""

from __future__ import annotations

import os
import sys
import types
from contextlib import contextmanager
from typing import Any

PLATFORM = "cpu"
"""VERL_PLATFORM's value that selects it (the rendered rehearsal environment sets it in every Ray process)."""


def _zero(*_args, **_kwargs) -> int:
    return 0


def _nothing(*_args, **_kwargs) -> None:
    return None


def device_module() -> types.SimpleNamespace:
    """`torch.cpu` with what verl calls on a device module and torch.cpu lacks: seeds and RNG state (torch's global
    generator), the device's name, empty_cache and a memory fraction that do nothing, memory statistics that read
    zero."""
    import torch

    names = ("set_device", "current_device", "device_count", "synchronize", "is_available", "current_stream",
             "stream", "Stream", "Event")
    shim = types.SimpleNamespace(**{n: getattr(torch.cpu, n) for n in names if hasattr(torch.cpu, n)})
    shim.manual_seed = torch.manual_seed
    shim.manual_seed_all = torch.manual_seed
    shim.get_rng_state, shim.set_rng_state = torch.get_rng_state, torch.set_rng_state
    shim.get_device_name = lambda *_a, **_k: "CPU"  # verl's FLOPs table has no CPU: MFU reads 0
    shim.empty_cache = shim.ipc_collect = shim.set_per_process_memory_fraction = _nothing
    for stat in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        setattr(shim, stat, _zero)
    shim.reset_peak_memory_stats = _nothing
    shim.mem_get_info = lambda *_a, **_k: (0, 0)
    return shim


def platform_class(base: type) -> type:
    """The CPU platform as a subclass of verl's PlatformBase (*base*)."""

    class PlatformCPU(base):
        """verl on CPU: gloo, logical GPUs in Ray, no IPC, no device calls."""

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: device_module())

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            return in_use()  # never auto-detected

        def current_device(self) -> str:
            # verl moves tensors with .to(get_device_id()): an index would mean an accelerator, "cpu" is the CPU
            return "cpu"

        def device_count(self) -> int:
            return 1

        set_device = synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = \
            staticmethod(_nothing)

        def manual_seed(self, seed: int) -> None:
            import torch

            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def ray_resource_name(self) -> str:
            return "GPU"  # verl's placement groups and resource check count Ray's GPU resource: logical ones here

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False  # verl then moves weights to the rollout through POSIX shared memory

        def cudart(self) -> Any:
            return None

    return PlatformCPU


def gloo_backend(original):
    """verl's initialize_global_process_group_ray with backend `gloo` when the CPU platform is in use (verl builds
    `cpu:gloo,<device>:<backend>`, which torch refuses when the device is cpu too)."""

    def initialize(timeout_second=None, backend=None):
        if backend is None and in_use():
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    initialize.__wrapped__ = original
    return initialize


def in_use() -> bool:
    """The CPU platform is the one asked for (VERL_PLATFORM=cpu)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


def vllm_lora_names() -> None:
    """verl's LoRA loader inside vLLM (its hijack of `_load_adapter`) asks vLLM >= 0.25 for
    `WeightsMapper.get_unstacked_mapper`; the vLLM CPU build installable beside torch 2.13 (0.32) names the same
    mapping `get_rename_mapper` (renames only, no stacking). Give the old name to the new method, only in a process
    where vLLM is already loaded (a rollout worker: verl is imported there after vLLM) and only when it is missing."""
    if "vllm" not in sys.modules:
        return
    from vllm.model_executor.models.utils import WeightsMapper

    if not hasattr(WeightsMapper, "get_unstacked_mapper") and hasattr(WeightsMapper, "get_rename_mapper"):
        WeightsMapper.get_unstacked_mapper = WeightsMapper.get_rename_mapper


def register() -> None:
    """verl's `verl.plugins` entry point: register the platform and wrap the process-group call (before
    verl.workers.engine_workers imports its name), give vLLM the name verl's LoRA loader calls where it lacks it, and
    install the fault suite's rollout failpoint (failpoint.py; inert unless armed)."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry
    from verl.utils import distributed

    if PlatformRegistry.get(PLATFORM) is None:
        PlatformRegistry.register(platform=PLATFORM)(platform_class(PlatformBase))
    if not hasattr(distributed.initialize_global_process_group_ray, "__wrapped__"):
        distributed.initialize_global_process_group_ray = gloo_backend(distributed.initialize_global_process_group_ray)
    if in_use():
        # verl registers its FSDP engines under the devices cuda and npu only; the registry's lookup key may be
        # set by this variable, and the engine then runs on the device the platform gives (the CPU).
        os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    vllm_lora_names()  # any platform: inert where vLLM still has the name verl calls (0.24, verl's own pin)
    from grpo_deploy.runtime.verl import failpoint

    failpoint.install()  # the fault suite's rollout hook: inert without GRPO_DEPLOY_FAILPOINTS and its file
