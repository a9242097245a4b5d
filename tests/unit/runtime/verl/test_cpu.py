"""grpo_deploy.runtime.verl.cpu without verl installed: the platform's answers, the device shim, the backend wrap
and the vLLM name, each inert unless asked for (verl itself runs them in `make test-verl`)."""

from __future__ import annotations

import sys
import types

from grpo_deploy.runtime.verl import cpu as verl_cpu


def test_the_platform_answers_as_verl_on_cpu_needs(monkeypatch):
    platform = verl_cpu.platform_class(object)()
    assert (platform.communication_backend_name(), platform.ray_resource_name()) == ("gloo", "GPU")
    assert platform.current_device() == "cpu" and platform.is_ipc_supported() is False
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert platform.is_platform_available() is False  # never chosen by auto-detection
    monkeypatch.setenv("VERL_PLATFORM", " CPU ")
    assert platform.is_platform_available() is True
    shim = verl_cpu.device_module()
    assert shim.get_device_name() == "CPU" and shim.max_memory_allocated() == 0 and shim.empty_cache() is None


def test_the_backend_becomes_gloo_only_with_the_platform_in_use(monkeypatch):
    seen = []
    wrapped = verl_cpu.gloo_backend(lambda timeout_second=None, backend=None: seen.append(backend))
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    wrapped()
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    wrapped()
    wrapped(backend="nccl")
    assert seen == [None, "gloo", "nccl"]


def _fake_vllm(monkeypatch, mapper: type) -> None:
    utils = types.ModuleType("vllm.model_executor.models.utils")
    utils.WeightsMapper = mapper
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.models"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.model_executor.models.utils", utils)


def test_vllm_gets_the_old_mapper_name_only_where_it_lacks_it(monkeypatch):
    class New:
        def get_rename_mapper(self):
            return "renamed"

    _fake_vllm(monkeypatch, New)
    verl_cpu.vllm_lora_names()
    assert New().get_unstacked_mapper() == "renamed"

    class Old:
        def get_unstacked_mapper(self):
            return "own"

        def get_rename_mapper(self):
            return "renamed"

    _fake_vllm(monkeypatch, Old)
    verl_cpu.vllm_lora_names()
    assert Old().get_unstacked_mapper() == "own"


def test_nothing_of_vllm_is_imported_where_it_is_not_loaded(monkeypatch):
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    verl_cpu.vllm_lora_names()
    assert "vllm" not in sys.modules
