"""Tests of grpo_deploy.hostchecks.runner (`grpo-deploy check`) and, through it, the checks it runs (hostchecks'
test_host.py and test_run.py, with conftest.py and plugin.py), against this machine (testinfra's local:// backend)
with a spec in tmp_path: `grpo-deploy check` passes on a shared directory made the way the spec wants it, and names
the host, the check and the fix when the directory is missing, owned by another UID, too tight, or the disk too small;
run checks fail with no run; exit codes; plain pytest. The pure parts are in test_targets.py and test_mounts.py.
Checks that need a Docker engine are left out with -k (tests/integration/test_hostchecks_remote.py runs them against
real hosts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_deploy.cli import main
from grpo_deploy.hostchecks import runner
from grpo_deploy.spec import new_spec
from tests.check_output import check_lines

NO_ENGINE = ["--", "-k", "shared_dir or headroom or nfs or gpus or nvidia"]  # what needs no Docker engine


def _run_ids() -> tuple[int, int]:
    """The run UID/GID these tests can give a directory: 1000:1000 as root, else this user's (never 0)."""
    return (1000, 1000) if os.getuid() == 0 else (os.getuid(), os.getgid())


def write_spec(tmp_path: Path, shared: Path | None = None, **changes) -> Path:
    """The embedded cpu rehearsal (one host, address local) with hosts[0].shared_dir = *shared*."""
    data = yaml.safe_load(new_spec.spec_text("cpu", "trl-async", []))
    uid, gid = _run_ids()
    data["run"].update(uid=uid, gid=gid)
    data["storage"]["nfs"] = None
    data["hosts"][0]["shared_dir"] = str(shared) if shared else None
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def shared(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    os.chown(folder, *_run_ids())
    folder.chmod(0o755)
    return folder


def check(tmp_path, monkeypatch, capsys, spec_path, *args) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    code = main(["check", "-f", str(spec_path), *args])
    out, err = capsys.readouterr()
    print(out, err)
    return code, out, err


def test_check_passes_on_a_shared_dir_made_as_the_spec_wants(tmp_path, monkeypatch, capsys, shared):
    code, out, _ = check(tmp_path, monkeypatch, capsys, write_spec(tmp_path, shared), *NO_ENGINE)
    got = check_lines(out)
    assert code == 0
    for name in ("shared_dir_present", "shared_dir_owner", "shared_dir_mode", "checkpoint_disk_headroom"):
        assert got[("local", name)].startswith("PASS"), out
    assert got[("local", "nfs_mount")].startswith("SKIP") and "storage.nfs is not set" in got[("local", "nfs_mount")]
    assert "profile cpu wants no CUDA" in got[("local", "gpus_visible")]
    assert "the spec has one host" in got[("local", "shared_dir_cross_host_write_read")]
    assert "0 failed" in out


def test_check_names_host_check_and_fix_when_the_owner_is_wrong(tmp_path, monkeypatch, capsys, shared):
    if os.getuid() != 0:
        pytest.skip("chown to another UID needs root")  # CI runs as root (GRPO_NO_SKIPS makes this skip fail there)
    os.chown(shared, 4242, 1000)
    code, out, _ = check(tmp_path, monkeypatch, capsys, write_spec(tmp_path, shared), *NO_ENGINE)
    line = check_lines(out)[("local", "shared_dir_owner")]
    assert code == 1
    assert line.startswith("FAIL") and f"{shared} is owned by 4242:1000" in line and "chown 1000:1000" in line
    assert check_lines(out)[("local", "shared_dir_present")].startswith("PASS")


def test_check_fails_when_the_shared_dir_is_missing(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "not-mounted"
    code, out, _ = check(tmp_path, monkeypatch, capsys, write_spec(tmp_path, missing), *NO_ENGINE)
    line = check_lines(out)[("local", "shared_dir_present")]
    assert code == 1 and line.startswith("FAIL") and f"{missing} does not exist" in line


def test_check_fails_when_the_run_user_cannot_write(tmp_path, monkeypatch, capsys, shared):
    shared.chmod(0o555)
    code, out, _ = check(tmp_path, monkeypatch, capsys, write_spec(tmp_path, shared), *NO_ENGINE)
    line = check_lines(out)[("local", "shared_dir_mode")]
    assert code == 1 and line.startswith("FAIL") and "mode 0555" in line and "chmod u+rwx" in line


def test_check_fails_when_the_disk_cannot_hold_the_plan(tmp_path, monkeypatch, capsys, shared):
    spec_path = write_spec(tmp_path, shared, **{"checkpoints.disk_margin_gb": 10.0**6})
    code, out, _ = check(tmp_path, monkeypatch, capsys, spec_path, "--", "-k", "headroom")
    line = check_lines(out)[("local", "checkpoint_disk_headroom")]
    assert code == 1 and line.startswith("FAIL") and "GB free on" in line and "1000000.0 GB at peak" in line
    assert "add at least" in line


def test_nfs_mount_fails_where_the_share_is_not_mounted(tmp_path, monkeypatch, capsys, shared):
    nfs = {"server": "nfs1", "export": "/srv/grpo", "options": "nfsvers=4.1,hard"}
    code, out, _ = check(tmp_path, monkeypatch, capsys, write_spec(tmp_path, shared, **{"storage.nfs": nfs}),
                         "--", "-k", "nfs")
    line = check_lines(out)[("local", "nfs_mount")]
    assert code == 1 and line.startswith("FAIL") and f"nothing is mounted at {shared}" in line
    assert "nfs1:/srv/grpo" in line


def test_run_checks_only_with_run_and_fail_without_a_run(tmp_path, monkeypatch, capsys, shared):
    spec_path = write_spec(tmp_path, shared, **{"run.name": "hostcheck-none"})
    code, out, _ = check(tmp_path, monkeypatch, capsys, spec_path, "--", "-k", "server_container")
    assert code == 2 and "server_container_healthy" not in out  # not selected without --run: nothing ran
    code, out, _ = check(tmp_path, monkeypatch, capsys, spec_path, "--run", "--", "-k", "server_container")
    line = check_lines(out)[("local", "server_container_healthy")]
    assert code == 1 and line.startswith("FAIL") and "no server container of run hostcheck-none" in line


def test_check_exit_2_on_an_invalid_spec_before_any_host_is_touched(tmp_path, monkeypatch, capsys, shared):
    spec_path = write_spec(tmp_path, shared, **{"run.uid": 0})
    code, out, err = check(tmp_path, monkeypatch, capsys, spec_path)
    assert code == 2 and "run.uid" in err and "PASS" not in out


def test_check_exit_2_and_the_install_hint_without_testinfra(tmp_path, monkeypatch, capsys, shared):
    monkeypatch.setitem(sys.modules, "testinfra", None)  # `import testinfra` raises ImportError
    code, _, err = check(tmp_path, monkeypatch, capsys, write_spec(tmp_path, shared))
    assert code == 2 and runner.INSTALL_HINT in err


def test_plain_pytest_runs_the_same_checks(tmp_path, shared):
    spec_path = write_spec(tmp_path, shared)
    os.chown(shared, 4242, 1000) if os.getuid() == 0 else shared.chmod(0o500)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "grpo_deploy.hostchecks.plugin", "--pyargs",
                           "grpo_deploy.hostchecks", "--hosts=local://", f"--spec={spec_path}", "-p",
                           "no:cacheprovider", "-q", "-k", "shared_dir"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    print(proc.stdout[-3000:], proc.stderr[-2000:])
    assert proc.returncode == 1
    assert "FAILED test_host.py::test_shared_dir_mode[local]" in proc.stdout
    assert "passed" in proc.stdout  # shared_dir_present


def test_check_verb_explains_itself(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "--ssh-config" in out and "--run" in out and "exit 0 all passed" in out
