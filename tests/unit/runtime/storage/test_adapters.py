"""Adapter housekeeping: pruning rules, fsync and modes around TRL's save, and stale unloads on the server."""

import os
import time
import types

import pytest

from grpo_deploy.runtime.storage import adapters
from grpo_deploy.runtime.storage.adapters import AdapterPublisher, prunable, prune_versions, safe_keep, unload_stale
from tests.unit.runtime.stub_server import StubServer


def make_versions(root, versions):
    for v in versions:
        (root / f"trl-policy-v{v}").mkdir(parents=True)
    (root / ".trl-policy-v9.tmp").mkdir()  # TRL's staging dir is never a version
    return str(root)


def test_prunable_keeps_newest_and_anything_newer_than_current():
    versions = {v: f"/a/v{v}" for v in (1, 2, 3, 4, 5, 6, 9)}
    assert prunable(versions, current=6, keep=4) == ["/a/v1", "/a/v2"]
    assert prunable(versions, current=3, keep=4) == []
    assert prunable({}, current=3, keep=1) == []


def test_prune_versions_deletes_directories(tmp_path):
    root = make_versions(tmp_path, [1, 2, 3, 4, 5])
    removed = prune_versions(root, current=5, keep=3)
    assert sorted(os.path.basename(p) for p in removed) == ["trl-policy-v1", "trl-policy-v2"]
    assert sorted(os.listdir(root)) == [".trl-policy-v9.tmp", "trl-policy-v3", "trl-policy-v4", "trl-policy-v5"]


def test_keep_never_drops_below_what_the_server_may_serve():
    assert safe_keep(None, max_staleness=2) == 4
    assert safe_keep(2, max_staleness=2) == 4
    assert safe_keep(7, max_staleness=2) == 7


def fake_save(model, accelerator, adapter_name, dest_dir):
    """What TRL's save leaves behind: a directory with a config and owner-only weights."""
    os.makedirs(dest_dir)
    with open(os.path.join(dest_dir, "adapter_config.json"), "w") as handle:
        handle.write("{}")
    fd = os.open(os.path.join(dest_dir, adapters.WEIGHTS_FILE), os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)


def test_publisher_records_save_load_and_prunes(tmp_path, monkeypatch):
    lora_dir = make_versions(tmp_path / ".vllm_lora", [1, 2, 3])
    events = []
    synced = []
    monkeypatch.setattr(adapters, "fsync_tree", lambda path: synced.append(path))
    publisher = AdapterPublisher(lambda event, **f: events.append((event, f)) or f, lora_dir, keep=2)
    save = publisher.wrap_save(fake_save)
    assert publisher.wrap_save(save).__wrapped__ is fake_save  # wrapping twice does not stack
    dest = os.path.join(lora_dir, "trl-policy-v4")
    save(None, types.SimpleNamespace(is_main_process=True), "default", dest)
    assert synced == [dest]  # flushed to disk before any load is requested
    now = time.time()
    publisher.record_load("trl-policy-v4", dest, 200, started=now, ended=now + 0.5)
    (name, load), (prune_name, prune) = events
    assert name == "adapter_load" and load["ok"] and load["status"] == 200 and load["mode"] == "0600"
    assert load["modes"]["adapter_config.json"] == format(0o666 & ~current_umask(), "04o")
    assert load["handoff_s"] >= load["save_s"] + 0.5 and load["load_s"] == 0.5
    assert prune_name == "adapter_prune" and sorted(map(os.path.basename, prune["removed"])) == [
        "trl-policy-v1",
        "trl-policy-v2",
    ]


def current_umask():
    value = os.umask(0)
    os.umask(value)
    return value


def test_failed_load_is_recorded_and_prunes_nothing(tmp_path):
    lora_dir = make_versions(tmp_path, [1, 2, 3])
    events = []
    publisher = AdapterPublisher(lambda event, **f: events.append((event, f)) or f, lora_dir, keep=1)
    publisher.record_load("trl-policy-v3", os.path.join(lora_dir, "trl-policy-v3"), 404, 0.0, 0.5, error="No adapter")
    assert [e for e, _ in events] == ["adapter_load"]
    assert events[0][1]["ok"] is False and events[0][1]["error"] == "No adapter"
    assert len(os.listdir(lora_dir)) == 4


def test_fsync_tree_and_file_modes(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("x")
    os.chmod(tmp_path / "a" / "b" / "f", 0o640)
    adapters.fsync_tree(str(tmp_path / "a"))
    assert adapters.file_modes(str(tmp_path / "a")) == {os.path.join("b", "f"): "0640"}


def test_unload_stale_unloads_only_policy_adapters():
    models = {"data": [{"id": "tiny"}, {"id": "trl-policy-v3"}, {"id": "trl-policy-v4"}, {"id": "other-lora"}]}
    routes = {("GET", "/v1/models"): (200, models), ("POST", "/v1/unload_lora_adapter"): (200, "ok")}
    with StubServer(routes) as server:
        assert unload_stale(server.url + "/") == ["trl-policy-v3", "trl-policy-v4"]
    posted = [body["lora_name"] for method, path, body in server.requests if method == "POST"]
    assert posted == ["trl-policy-v3", "trl-policy-v4"]


def test_unload_stale_fails_loudly():
    routes = {
        ("GET", "/v1/models"): (200, {"data": [{"id": "trl-policy-v1"}]}),
        ("POST", "/v1/unload_lora_adapter"): (500, {"error": "boom"}),
    }
    with StubServer(routes) as server, pytest.raises(RuntimeError, match="trl-policy-v1 .* 500"):
        unload_stale(server.url)
    with StubServer({}) as server, pytest.raises(RuntimeError, match="404"):
        unload_stale(server.url)
