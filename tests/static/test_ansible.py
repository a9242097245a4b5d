"""Static and local checks of the Ansible skeleton in ansible/.

- ansible-lint (production profile, warnings as errors) over ansible/;
- ansible-playbook --syntax-check of site.yml with the example inventory, and that inventory's groups as
  Ansible itself reads them;
- the role layout (defaults/main.yml, tasks/main.yml, vars/Debian.yml);
- a real run of the run_user, shared_dir and verify roles on this machine (local connection), with a user and
  group that cannot clash (grpo-test, UID/GID 4242) and every path under pytest's tmp dir: the first run
  changes the host, the second changes nothing, verify fails once the directory is wrong, and the user and
  group are removed afterwards. Needs root (the CI container runs as root).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
ROLES = ("run_user", "shared_dir", "verify")
TEST_USER, TEST_ID = "grpo-test", 4242


def tool(name: str) -> str:
    path = shutil.which(name) or (str(Path(sys.executable).parent / name)
                                  if (Path(sys.executable).parent / name).exists() else None)
    assert path, f"{name} not found: pip install ansible-core ansible-lint"
    return path


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "NO_COLOR": "1", "ANSIBLE_FORCE_COLOR": "0", **kw.pop("env", {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 300), env=env, **kw)


def test_ansible_lint_production_profile():
    proc = run([tool("ansible-lint"), "--strict", "--profile", "production", "ansible/"], cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Profile 'production' was required, and it passed" in out, out


def test_site_syntax_check_with_example_inventory():
    proc = run([tool("ansible-playbook"), "--syntax-check", "-i", "inventory.example.yml", "site.yml"], cwd=ANSIBLE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_example_inventory_groups():
    proc = run([tool("ansible-inventory"), "-i", "inventory.example.yml", "--list"], cwd=ANSIBLE)
    assert proc.returncode == 0, proc.stderr
    inv = json.loads(proc.stdout)
    assert inv["trainers"]["hosts"] == ["spark1"]
    assert inv["servers"]["hosts"] == ["spark2"]
    assert inv["nfs_server"]["hosts"] == ["spark1"]
    site = yaml.safe_load((ANSIBLE / "site.yml").read_text())
    targets = set(re.split(r"[:,]", site[0]["hosts"]))
    assert {"trainers", "servers", "nfs_server"} <= targets
    assert [r["role"] if isinstance(r, dict) else r for r in site[0]["roles"]] == list(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_role_layout(role):
    base = ANSIBLE / "roles" / role
    for rel in ("defaults/main.yml", "tasks/main.yml", "vars/Debian.yml"):
        assert (base / rel).is_file(), f"roles/{role}/{rel} missing"
    defaults = yaml.safe_load((base / "defaults/main.yml").read_text())
    assert defaults and all(k.startswith(f"{role}_") for k in defaults), f"public knobs of {role} need its prefix"
    tasks = yaml.safe_load((base / "tasks/main.yml").read_text())
    for task in tasks:
        if "ansible.builtin.assert" in task:
            that = task["ansible.builtin.assert"]["that"]
            that = that if isinstance(that, list) else [that]
            assert not any(str(t).strip().lower() in ("true", "1", "yes") for t in that), f"stub assert in {role}"


# --- a real run on this machine -----------------------------------------------------------------------------


def _entry(lookup, key):
    try:
        return lookup(key)
    except KeyError:
        return None


def _remove_test_identity():
    """Remove grpo-test only where it is ours (the name AND the id match): nothing else is ever touched."""
    user = _entry(pwd.getpwnam, TEST_USER)
    if user is not None and user.pw_uid == TEST_ID:
        subprocess.run(["userdel", TEST_USER], check=True, capture_output=True)
    group = _entry(grp.getgrnam, TEST_USER)
    if group is not None and group.gr_gid == TEST_ID:
        subprocess.run(["groupdel", TEST_USER], check=True, capture_output=True)


@pytest.fixture
def test_identity():
    assert os.geteuid() == 0, "the local Ansible run creates a user: run the tests as root (as CI does)"
    _remove_test_identity()  # a leftover of an interrupted run of this test
    clash = [str(e) for e in (_entry(pwd.getpwuid, TEST_ID), _entry(grp.getgrgid, TEST_ID),
                              _entry(pwd.getpwnam, TEST_USER), _entry(grp.getgrnam, TEST_USER)) if e]
    assert not clash, f"UID/GID {TEST_ID} or name {TEST_USER} already used on this machine: {clash}"
    try:
        yield
    finally:
        _remove_test_identity()
    assert _entry(pwd.getpwnam, TEST_USER) is None and _entry(grp.getgrnam, TEST_USER) is None


def _recap(out: str) -> dict[str, int]:
    match = re.search(r"localhost\s*:\s*(.*)", out.split("PLAY RECAP")[-1])
    assert match, out
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


def test_roles_converge_locally_and_are_idempotent(tmp_path, test_identity):
    home = tmp_path / "root" / "home" / TEST_USER
    shared = tmp_path / "root" / "shared"
    def write_play(name: str, roles: list[str]) -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump([{
            "name": "Rehearse the run identity roles on this machine",
            "hosts": "localhost", "connection": "local", "gather_facts": True, "gather_subset": ["min"],
            "roles": roles,
        }], sort_keys=False))
        return path

    play = write_play("play.yml", list(ROLES))
    extra = {"run_user_name": TEST_USER, "run_user_group": TEST_USER, "run_user_uid": TEST_ID,
             "run_user_gid": TEST_ID, "run_user_home": str(home), "shared_dir_path": str(shared),
             "ansible_python_interpreter": sys.executable}
    cmd = [tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(play), "-e", json.dumps(extra)]
    env = {"ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles")}

    first = run(cmd, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    recap = _recap(first.stdout)
    assert recap["failed"] == 0 and recap["changed"] >= 3, recap  # group, user, directory
    user = pwd.getpwnam(TEST_USER)
    assert (user.pw_uid, user.pw_gid, user.pw_dir, user.pw_shell) == (TEST_ID, TEST_ID, str(home), "/usr/sbin/nologin")
    st = shared.stat()
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (TEST_ID, TEST_ID, "0o775")

    second = run(cmd, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    recap = _recap(second.stdout)
    assert recap["changed"] == 0 and recap["failed"] == 0, f"second run changed something: {recap}\n{second.stdout}"

    # verify reads the host: a directory with the wrong mode must fail it, and it says what it found.
    shared.chmod(0o700)
    verify_play = write_play("verify.yml", ["verify"])
    broken = run([tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(verify_play),
                  "-e", json.dumps(extra)],
                 env=env)
    assert broken.returncode != 0, broken.stdout
    assert "expected a directory 4242:4242 mode 0775" in broken.stdout, broken.stdout
