"""Shared-volume faults: how a path looks to a process, which errors are faults of the share, and the messages."""

import dataclasses
import errno
import json
import os
import shutil
import tempfile

import pytest

from grpo_deploy.common.metrics import MetricsSink
from grpo_deploy.runtime.storage import faults as sf
from tests.unit.runtime.as_root import as_uid

NOBODY = 65534


def view_as_nobody(path: str) -> dict:
    """`view(path)` in a forked child of uid/gid 65534 (these tests run as root, whom no mode stops; the
    interpreter under /root is not executable by nobody, so no new process)."""
    if os.getuid() != 0:
        return dataclasses.asdict(sf.view(path))
    return as_uid(NOBODY, lambda: dataclasses.asdict(sf.view(path)))


@pytest.fixture()
def open_dir():
    """A directory every user may enter (pytest's tmp_path sits under a root-only 0700 folder)."""
    path = tempfile.mkdtemp(prefix="grpo-sf-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(path)


def test_view_names_the_first_component_it_cannot_enter(open_dir):
    lora = os.path.join(open_dir, "out", ".vllm_lora")
    os.makedirs(os.path.join(lora, "trl-policy-v3"))
    os.chmod(lora, 0o000)
    seen = view_as_nobody(os.path.join(lora, "trl-policy-v3"))
    assert seen["blocked"] == lora and seen["problem"] == "no access" and seen["mode"] == "0000"
    assert seen["owner"] == f"{os.getuid()}:{os.getgid()}"


def test_view_of_a_readable_path_and_of_a_missing_one(open_dir):
    os.makedirs(os.path.join(open_dir, "a"))
    assert view_as_nobody(os.path.join(open_dir, "a"))["problem"] is None
    gone = sf.view(os.path.join(open_dir, "b", "c"))
    assert (gone.blocked, gone.problem) == (os.path.join(open_dir, "b"), "missing")
    assert gone.words() == f"{open_dir}/b does not exist"


def test_view_of_an_unreadable_directory(open_dir):
    os.chmod(open_dir, 0o711)  # enterable, not listable
    seen = view_as_nobody(open_dir)
    assert seen["problem"] == "not readable" and seen["mode"] == "0711"


def test_classify_finds_the_oserror_in_the_chain_under_the_shared_roots(tmp_path):
    (tmp_path / "out" / ".vllm_lora").mkdir(parents=True)
    path = str(tmp_path / "out" / ".vllm_lora" / ".trl-policy-v7.tmp")  # never made: the write failed
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", path)
        except OSError as inner:
            raise RuntimeError("sync failed") from inner
    except RuntimeError as outer:
        fault = sf.classify(outer, [str(tmp_path / "out")], 1000, 1000, str(tmp_path / "out" / "checkpoint-4"))
    lora = str(tmp_path / "out" / ".vllm_lora")
    assert fault.kind == "read-only" and fault.path == lora  # the directory that exists, not the file never made
    assert f"{lora} is read-only (Read-only file system, writing .trl-policy-v7.tmp; mount " in fault.message
    assert "uid 1000:1000" in fault.message
    assert "checkpoint-4 is kept" in fault.message and "remount the share read-write" in fault.message
    assert "grpo-deploy up" in fault.message


def test_classify_a_real_enoent_and_leave_other_errors_alone(tmp_path):
    with pytest.raises(OSError) as gone:
        open(tmp_path / "run" / "checkpoints" / "x", "w")  # noqa: SIM115 - the real error is the point
    fault = sf.classify(gone.value, [str(tmp_path / "run")], 1000, 1000, None)
    assert fault.kind == "missing" and f"{tmp_path}/run does not exist" in fault.message
    assert "no checkpoint was complete yet" in fault.message
    assert sf.classify(gone.value, ["/elsewhere"], 1000, 1000, None) is None  # not the shared volume
    assert sf.classify(ValueError("bad config"), [str(tmp_path)], 1000, 1000, None) is None
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "x"))
    assert sf.classify(full, [str(tmp_path)], 1000, 1000, None) is None  # the disk watchdog's business


def test_permission_message_says_how_to_give_the_directory_back(tmp_path):
    error = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x"))
    fault = sf.classify(error, [str(tmp_path)], 1000, 1001, None)
    assert fault.kind == "permission" and "may not write" in fault.message and "chown -R 1000:1001" in fault.message


def test_a_storage_fault_keeps_its_own_classification():
    fault = sf.Fault("adapter-unreadable", "/s/a", "m")
    assert sf.classify(sf.StorageFault(fault), ["/nowhere"], 1, 1, None) is fault


@pytest.mark.parametrize(("status", "body", "expected"), [
    (404, '{"error":{"message":"Loading lora trl-policy-v2 failed: No adapter found for /s/x","code":404}}', True),
    (400, '{"error":{"message":"[Errno 13] Permission denied: \'/s/x/adapter_config.json\'"}}', True),
    (500, '{"error":{"message":"Call to add_lora method failed: Worker failed with error \'[Errno 13] Permission '
          'denied: \'/s/.vllm_lora<path>\'\'","type":"InternalServerError","code":500}}', True),  # seen: vLLM 0.32 CPU
    (404, '{"detail":"Not Found"}', False),  # the endpoint really is missing (no VLLM_ALLOW_RUNTIME_LORA_UPDATING)
    (500, '{"error":{"message":"CUDA out of memory"}}', False),
    (200, "Success: No adapter found", False),
    (None, "ConnectionError: refused", False),
])
def test_server_cannot_read(status, body, expected):
    assert sf.server_cannot_read(status, body) is expected


def test_adapter_unreadable_message_names_path_identity_and_fix(open_dir):
    body = '{"error":{"message":"Loading lora trl-policy-v7 failed: No adapter found for /s/x","code":404}}'
    message = sf.adapter_unreadable_message("trl-policy-v7", f"{open_dir}/trl-policy-v7", 404, body, 1000, 1000,
                                            sf.view(open_dir))
    assert message.startswith("adapter unreadable: the vLLM server could not read adapter trl-policy-v7 at ")
    assert "HTTP 404: Loading lora trl-policy-v7 failed: No adapter found" in message
    assert "not a missing endpoint" in message and "The server runs as uid 1000:1000" in message
    assert "the server host sees the directory differently" in message  # the trainer reads it fine
    folder = os.path.dirname(f"{open_dir}/trl-policy-v7")
    assert f"make {folder} and its files readable to uid 1000" in message and f"chown -R 1000:1000 {folder}" in message
    assert "grpo-deploy preflight" in message and message.endswith("newest complete checkpoint.")
    blocked = sf.PathView("/s/x", "/s", "no access", "0000", "0:0")
    assert "as the trainer (uid 1000:1000) sees it, /s is mode 0000, owner 0:0 (no access)" in \
        sf.adapter_unreadable_message("n", "/s/x", 404, body, 1000, 1000, blocked)


def test_server_reason_falls_back_to_the_body():
    assert sf.server_reason('{"error":{"message":"nope"}}') == "nope"
    assert sf.server_reason('{"error":{"message":"denied, please check the stack trace above for it"}}') == "denied"
    assert sf.server_reason("plain text") == "plain text"
    assert sf.server_reason(None) == ""


def test_metrics_sink_keeps_running_when_its_file_cannot_be_written(capsys):
    sink = MetricsSink("/dev/full")  # every write fails with ENOSPC, like a share that went away
    record = sink.emit("storage_fault", message="m")
    sink.close()
    assert record["event"] == "storage_fault"
    err = capsys.readouterr().err
    assert "metrics: not written to /dev/full" in err and '"event":"storage_fault"' in err


def test_share_guard_notices_a_run_dir_gone_or_replaced(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    guard = sf.ShareGuard(str(run), 1000, 1000, newest=lambda: f"{run}/checkpoints/checkpoint-4")
    guard.check()  # unchanged: nothing to say
    shutil.rmtree(run)
    run.mkdir()  # what makedirs does after the share vanished: a new, empty directory at the same path
    with pytest.raises(sf.StorageFault) as replaced:
        guard.check()
    assert replaced.value.fault.kind == "missing" and "another directory is at its path" in str(replaced.value)
    assert "checkpoint-4 is kept" in str(replaced.value) and "mount the share again" in str(replaced.value)
    run.rmdir()
    with pytest.raises(sf.StorageFault) as gone:
        guard.check()
    assert gone.value.fault.kind == "missing" and f"{run} does not exist" in str(gone.value)


def test_the_adapter_publisher_checks_the_share_before_each_save(tmp_path):
    from types import SimpleNamespace

    from grpo_deploy.runtime.storage.adapters import AdapterPublisher

    saved = []
    fault = sf.StorageFault(sf.Fault("missing", "/s", "gone"))

    def check():
        if saved:
            raise fault

    publisher = AdapterPublisher(lambda event, **f: f, str(tmp_path), keep=2, before_save=check)
    save = publisher.wrap_save(lambda model, acc, name, dest: saved.append(dest) or os.makedirs(dest))
    save(None, SimpleNamespace(is_main_process=True), "default", str(tmp_path / "trl-policy-v1"))
    with pytest.raises(sf.StorageFault):
        save(None, SimpleNamespace(is_main_process=True), "default", str(tmp_path / "trl-policy-v2"))
    assert saved == [str(tmp_path / "trl-policy-v1")]  # nothing written once the share is gone


MOUNTINFO = """\
613 540 0:52 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/l
640 613 8:1 /var/lib/docker/volumes/grpo-deploy-shared/_data /shared rw,relatime master:1 - ext4 /dev/sda1 rw
700 640 8:1 /var/lib/docker/volumes/grpo-deploy-shared/_data/runs/faults/checkpoints /shared/runs/faults/checkpoints \
ro,relatime - ext4 /dev/sda1 rw
701 613 0:60 / /mnt/with\\040space rw - tmpfs tmpfs rw
"""


def test_mount_of_takes_the_longest_mount_point_above_the_path():
    inner = sf.mount_of("/shared/runs/faults/checkpoints/.vllm_lora", MOUNTINFO)
    assert inner.point == "/shared/runs/faults/checkpoints" and inner.read_only and inner.fstype == "ext4"
    outer = sf.mount_of("/shared/runs/faults/metrics.jsonl", MOUNTINFO)
    assert outer.point == "/shared" and not outer.read_only
    assert sf.mount_of("/etc/passwd", MOUNTINFO).point == "/"
    assert sf.mount_of("/mnt/with space/x", MOUNTINFO).point == "/mnt/with space"
    assert sf.mount_of("/shared-other", MOUNTINFO).point == "/"  # a prefix of the name is not a parent
    assert sf.mount_of("/x", "garbage") is None
    assert sf.mount_of("/") is not None  # this machine's own table


def test_classify_names_the_first_missing_directory(tmp_path):
    error = FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path / "run" / "ck" / "x"))
    fault = sf.classify(error, [str(tmp_path)], 1000, 1000, None)
    assert fault.path == str(tmp_path / "run") and f"{tmp_path}/run is gone" in fault.message


def test_view_command_prints_json(open_dir, capsys):
    assert sf.main(["view", open_dir]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["path"] == open_dir and printed["problem"] is None and printed["uid"] == os.getuid()
