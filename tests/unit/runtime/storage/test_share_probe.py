"""Permission probe: write as the trainer would, read back as the server would."""

import json
import os
import shutil
import stat
import tempfile

import pytest

pytest.importorskip("safetensors")

from grpo_deploy.runtime.storage import share_probe as probe
from tests.unit.runtime.as_root import as_uid  # noqa: E402


def run(capsys, *argv):
    code = probe.main(list(argv))
    return code, json.loads(capsys.readouterr().out)


def test_write_then_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GRPO_UMASK", "0022")
    previous = os.umask(0o022)
    try:
        code, written = run(capsys, "write", "--dir", str(tmp_path))
    finally:
        os.umask(previous)
    assert code == 0 and written["uid"] == os.getuid() and written["umask"] == "0022"
    assert written["path"] == str(tmp_path / f"probe-{os.getuid()}" / "adapter_model.safetensors")
    actual = format(stat.S_IMODE(os.stat(written["path"]).st_mode), "04o")
    assert written["file_mode"] == actual and written["dir_mode"] == "0755" and written["config_mode"] == "0644"
    code, read = run(capsys, "read", "--dir", str(tmp_path))
    assert code == 0 and read["ok"] and read["files"] == 2 and read["errors"] == []


def test_probe_weights_get_the_mode_of_a_torch_save(tmp_path, capsys):
    """The probe writes through safetensors' numpy front end; PEFT saves through the torch one. Same mode."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    _, written = run(capsys, "write", "--dir", str(tmp_path))
    adapter = tmp_path / "adapter_model.safetensors"
    save_file({"w": torch.zeros(1, 4)}, str(adapter))
    assert written["file_mode"] == format(stat.S_IMODE(os.stat(adapter).st_mode), "04o")


def test_read_reports_damaged_and_missing_probes(tmp_path, capsys):
    code, read = run(capsys, "read", "--dir", str(tmp_path))
    assert code == 1 and "no probe files" in read["errors"][0]["error"]
    target = tmp_path / "probe-4242"
    target.mkdir()
    (target / "adapter_model.safetensors").write_bytes(b"not safetensors")
    (target / "adapter_config.json").write_text("{}")
    code, read = run(capsys, "read", "--dir", str(tmp_path))
    assert code == 1 and [os.path.basename(e["path"]) for e in read["errors"]] == ["adapter_model.safetensors"]


def read_as(uid, directory):
    """`read_probes` in a forked child that has switched to `uid`, like a server running as another user."""
    import safetensors  # noqa: F401  (imported before the switch: the new user may not read the install)

    return as_uid(uid, lambda: probe.read_probes(directory))


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_another_uid_cannot_read_the_adapter_weights():
    """The seed-004 failure: weights written owner-only (safetensors 0.8.0) are unreadable to a server of another
    uid, while the umask-governed config stays readable. Same uid reads everything."""
    directory = tempfile.mkdtemp(prefix="probe-test-")
    try:
        os.chmod(directory, 0o755)
        written = probe.write_probe(directory)
        other = read_as(65534, directory)
        assert read_as(os.getuid(), directory)["ok"]
    finally:
        shutil.rmtree(directory)
    if written["file_mode"] == "0600":
        assert not other["ok"]
        assert [os.path.basename(e["path"]) for e in other["errors"]] == ["adapter_model.safetensors"]
        assert "Permission denied" in other["errors"][0]["error"]
    else:  # a safetensors release that honours the umask: the other uid can read
        assert other["ok"]


def test_read_reports_permission_denied(capsys):
    """An unreadable weights file is reported as a PermissionError (as root the reader drops to nobody)."""
    directory = tempfile.mkdtemp(prefix="probe-test-")
    try:
        os.chmod(directory, 0o755)
        probe.write_probe(directory)
        os.chmod(os.path.join(directory, f"probe-{os.getuid()}", "adapter_model.safetensors"), 0)
        if os.geteuid() == 0:
            code, read = (0 if (r := read_as(65534, directory))["ok"] else 1), r
        else:
            code, read = run(capsys, "read", "--dir", directory)
    finally:
        shutil.rmtree(directory)
    assert code == 1 and "PermissionError" in read["errors"][0]["error"]


def test_write_to_unwritable_place_fails_cleanly(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, out = run(capsys, "write", "--dir", str(blocker))
    assert code == 1 and out["ok"] is False
