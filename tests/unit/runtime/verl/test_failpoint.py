"""The verl rollout's fault-suite hook (runtime/verl/failpoint.py): inert without its variable and its file; armed, an
adapter sync is acknowledged and not sent, a base sync always is; the wrap waits on an import hook for its module."""

from __future__ import annotations

import asyncio
import functools
import sys
import types

import pytest

from grpo_deploy.runtime.verl import failpoint


def no_grad(function):
    """What torch.no_grad() does to verl's method: a functools.wraps wrapper, so it has __wrapped__ already."""

    @functools.wraps(function)
    async def inner(*args, **kwargs):
        return await function(*args, **kwargs)

    return inner


class ServerAdapter:
    """verl 0.9.1's ServerAdapter.update_weights' signature and decoration, recording what it was sent."""

    def __init__(self):
        self.sent = []

    @no_grad
    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        self.sent.append((weights, kwargs.get("base_sync_done")))
        return "sent"


def sync(adapter, base_sync_done: bool, peft=True):
    return asyncio.run(adapter.update_weights("w", global_steps=3, peft_config={"r": 8} if peft else None,
                                              base_sync_done=base_sync_done))


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(failpoint.ENV, str(tmp_path))
    return tmp_path


def test_armed_only_by_a_plain_file_in_the_named_folder(folder, monkeypatch):
    assert not failpoint.armed()
    (folder / failpoint.ROLLOUT_KEEPS_ADAPTER).symlink_to("/etc/hostname")
    assert not failpoint.armed()  # a link is not the fault suite's file
    (folder / failpoint.ROLLOUT_KEEPS_ADAPTER).unlink()
    (folder / failpoint.ROLLOUT_KEEPS_ADAPTER).touch()
    assert failpoint.armed()
    monkeypatch.delenv(failpoint.ENV)
    assert not failpoint.armed()


def test_armed_an_adapter_sync_is_acknowledged_and_not_sent_a_base_sync_always_is(folder, capsys):
    module = types.SimpleNamespace(ServerAdapter=type("ServerAdapter", (ServerAdapter,), {}))
    failpoint.patch(module)
    failpoint.patch(module)  # once is enough: no wrap of the wrap
    adapter = module.ServerAdapter()
    assert sync(adapter, True) == "sent" and len(adapter.sent) == 1
    (folder / failpoint.ROLLOUT_KEEPS_ADAPTER).touch()
    assert sync(adapter, True) is None and len(adapter.sent) == 1
    assert "LoRA sync acknowledged, not applied (step 3)" in capsys.readouterr().err
    assert sync(adapter, False) == "sent" and sync(adapter, True, peft=False) == "sent"  # base weights: sent
    (folder / failpoint.ROLLOUT_KEEPS_ADAPTER).unlink()
    assert sync(adapter, True) == "sent" and len(adapter.sent) == 4


def test_install_wraps_the_module_when_it_is_imported_later(folder, tmp_path, monkeypatch):
    package = tmp_path / "pkgs" / "fakeverl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "rollout.py").write_text(  # verl's method is a wrapper (torch.no_grad) with __wrapped__ already
        "import functools\n\n\ndef no_grad(f):\n    @functools.wraps(f)\n    async def inner(*a, **k):\n"
        "        return await f(*a, **k)\n    return inner\n\n\nclass ServerAdapter:\n    @no_grad\n"
        "    async def update_weights(self, w, **k):\n        return 'sent'\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setattr(failpoint, "TARGET", "fakeverl.rollout")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    failpoint.install()
    failpoint.install()  # one hook, not two
    assert sum(isinstance(f, failpoint._AfterImport) for f in sys.meta_path) == 1
    import importlib.util

    import fakeverl

    assert importlib.util.find_spec("fakeverl.rollout") is not None  # a probe that does not import: hook kept
    assert "fakeverl.rollout" not in sys.modules and any(isinstance(f, failpoint._AfterImport) for f in sys.meta_path)
    import fakeverl.rollout as rollout

    assert fakeverl.rollout is rollout

    assert getattr(rollout.ServerAdapter.update_weights, failpoint.MARK, False)
    assert not any(isinstance(f, failpoint._AfterImport) for f in sys.meta_path)  # it left once used
    (folder / failpoint.ROLLOUT_KEEPS_ADAPTER).touch()
    assert sync(rollout.ServerAdapter(), True) is None
    (folder / failpoint.ROLLOUT_KEEPS_ADAPTER).unlink()
    assert sync(rollout.ServerAdapter(), True) == "sent"
    for name in ("fakeverl.rollout", "fakeverl"):
        sys.modules.pop(name, None)


def test_nothing_is_installed_without_the_variable(monkeypatch):
    monkeypatch.delenv(failpoint.ENV, raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    failpoint.install()
    assert not any(isinstance(f, failpoint._AfterImport) for f in sys.meta_path)


def test_the_folder_is_the_trl_failpoints_folder_in_the_checkpoint_folder():
    from grpo_deploy.runtime.serving.failpoint import FAILPOINT_DIR

    assert failpoint.folder("/shared/runs/r/checkpoints") == f"/shared/runs/r/checkpoints/{FAILPOINT_DIR}"
