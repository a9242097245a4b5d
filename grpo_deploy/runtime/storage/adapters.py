"""Adapter housekeeping on the shared volume: fsync before load, file modes, version pruning, stale server unloads."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from grpo_deploy.runtime import run_token
from grpo_deploy.runtime.identity import format_mode

log = logging.getLogger(__name__)

POLICY_PREFIX = "trl-policy-"
VERSION_PATTERN = re.compile(r"^trl-policy-v(\d+)$", re.ASCII)
WEIGHTS_FILE = "adapter_model.safetensors"
LORA_SUBDIR = ".vllm_lora"  # where TRL 1.16 publishes adapter versions under its output_dir


def fsync_tree(path: str) -> None:
    """fsync every file below `path`, then every directory bottom-up, then `path`'s parent (which holds its name)."""
    for root, _dirs, files in os.walk(path, topdown=False):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_modes(path: str) -> dict[str, str]:
    """Permission bits of each file in an adapter directory, relative name -> `0644`."""
    modes = {}
    for root, _dirs, files in os.walk(path):
        for name in sorted(files):
            full = os.path.join(root, name)
            modes[os.path.relpath(full, path)] = mode_of(full)
    return modes


def list_versions(lora_dir: str) -> dict[int, str]:
    """Published adapter versions in `lora_dir`: version number -> directory (TRL's staging dirs are ignored)."""
    try:
        names = os.listdir(lora_dir)
    except FileNotFoundError:
        return {}
    versions = {}
    for name in names:
        match = VERSION_PATTERN.match(name)
        if match and os.path.isdir(os.path.join(lora_dir, name)):
            versions[int(match.group(1))] = os.path.join(lora_dir, name)
    return versions


def prunable(versions: dict[int, str], current: int, keep: int) -> list[str]:
    """Directories to delete: versions older than the newest `keep` at or below `current`. Newer ones are left alone."""
    at_or_below = sorted(v for v in versions if v <= current)
    doomed = at_or_below[: max(len(at_or_below) - keep, 0)]
    return [versions[v] for v in doomed]


def prune_versions(lora_dir: str, current: int, keep: int) -> list[str]:
    """Delete adapter versions beyond `keep` (see `prunable`); returns the removed paths."""
    removed = []
    for path in prunable(list_versions(lora_dir), current, keep):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


def safe_keep(keep: int | None, max_staleness: int) -> int:
    """Versions to keep on disk: at least `max_staleness + 2`, the ones the server may still serve or resolve."""
    floor = max_staleness + 2
    if keep is None:
        return floor
    if keep < floor:
        log.warning(f"adapters.keep={keep} would delete versions the server may still serve; keeping {floor}")
        return floor
    return keep


def _http_json(method: str, url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, str]:
    """One call to the server (or the kit's front: the run's token sent when this process has one)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **run_token.env_headers()})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def loaded_adapters(server_url: str, prefix: str = POLICY_PREFIX, timeout: float = 10.0) -> list[str]:
    """Names of the server's loaded LoRA adapters starting with `prefix`, from `GET /v1/models`."""
    status, text = _http_json("GET", f"{server_url.rstrip('/')}/v1/models", timeout=timeout)
    if status != 200:
        raise RuntimeError(f"GET {server_url}/v1/models answered {status}: {text[:300]}")
    return sorted(entry["id"] for entry in json.loads(text).get("data", []) if entry["id"].startswith(prefix))


def unload_stale(server_url: str, prefix: str = POLICY_PREFIX, timeout: float = 10.0) -> list[str]:
    """Unload every `trl-policy-*` adapter the server holds; TRL treats re-loading an existing name as fatal."""
    unloaded = []
    for name in loaded_adapters(server_url, prefix, timeout):
        status, text = _http_json(
            "POST", f"{server_url.rstrip('/')}/v1/unload_lora_adapter", {"lora_name": name}, timeout
        )
        if status != 200:
            raise RuntimeError(f"unloading stale adapter {name} from {server_url} answered {status}: {text[:300]}")
        unloaded.append(name)
    return unloaded


def resume_server(server_url: str, timeout: float = 10.0) -> bool:
    """Best-effort `POST /resume`: a sync that failed after `/pause` leaves the server paused."""
    try:
        status, _ = _http_json("POST", f"{server_url.rstrip('/')}/resume", timeout=timeout)
    except OSError:
        return False
    return status == 200


@dataclass
class _Saved:
    started: float
    save_s: float
    fsync_s: float
    modes: dict[str, str]
    dir_mode: str


@dataclass
class AdapterPublisher:
    """Times and records every adapter TRL publishes, and prunes old versions once the server has the new one.

    `wrap_save` wraps TRL's `save_lora_adapter(model, accelerator, adapter_name, dest_dir)` so that the published
    directory is fsynced (files, directory, parent) before the trainer asks the server to load it; `record_load` is
    called by the instrumented HTTP client with the server's answer and emits one `adapter_load` event.
    """

    emit: Callable[..., dict]
    lora_dir: str
    keep: int
    before_save: Callable[[], None] | None = None  # e.g. storage_faults.ShareGuard.check: raises when the share went
    _saved: dict[str, _Saved] = field(default_factory=dict)

    def wrap_save(self, save: Callable) -> Callable:
        original = getattr(save, "__wrapped__", save)

        def save_and_sync(model, accelerator, adapter_name, dest_dir):
            if self.before_save is not None:
                self.before_save()
            started = time.time()
            original(model, accelerator, adapter_name, dest_dir)
            if not accelerator.is_main_process:
                return
            saved = time.time()
            fsync_tree(dest_dir)
            self._saved[os.path.abspath(dest_dir)] = _Saved(
                started=started,
                save_s=saved - started,
                fsync_s=time.time() - saved,
                modes=file_modes(dest_dir),
                dir_mode=mode_of(dest_dir),
            )

        save_and_sync.__wrapped__ = original
        return save_and_sync

    def record_load(self, name: str, path: str, status: int | None, started: float, ended: float, error=None) -> dict:
        saved = self._saved.pop(os.path.abspath(path), None)
        ok = status == 200
        event = self.emit(
            "adapter_load",
            name=name,
            path=path,
            status=status,
            ok=ok,
            error=error,
            save_s=saved.save_s if saved else None,
            fsync_s=saved.fsync_s if saved else None,
            load_s=ended - started,
            handoff_s=ended - saved.started if saved else None,
            mode=saved.modes.get(WEIGHTS_FILE) if saved else None,
            modes=saved.modes if saved else None,
            dir_mode=saved.dir_mode if saved else None,
        )
        if ok:
            match = VERSION_PATTERN.match(name)
            if match:
                removed = prune_versions(self.lora_dir, int(match.group(1)), self.keep)
                if removed:
                    self.emit("adapter_prune", removed=removed)
        return event


def mode_of(path: str) -> str:
    """Permission bits of one path as `0644`."""
    return format_mode(os.stat(path).st_mode)
