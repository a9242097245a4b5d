"""Static and local checks of the Ansible host setup in ansible/ (the real runs over SSH against test hosts are in
tests/integration/test_ansible_hosts.py).

- ansible-lint (production profile, warnings as errors) over ansible/;
- ansible-playbook --syntax-check of site.yml with the example inventory, and that inventory's groups as
  Ansible itself reads them;
- the role layout (defaults/main.yml, tasks/main.yml; vars/Debian.yml and vars/Ubuntu.yml where a role has
  per-distribution values), no stub asserts;
- the Spark direct-link netplan file and the NFS export line rendered by Ansible's own template module, then read
  back (one /24 per link, the host's address on each, the MTU; root_squash for every client);
- hostile inventory values (newline, `$`, `..`, a leading `-`, uid 0, no_root_squash, soft, a /16) refused by each
  role's input check with its one message, in check mode (nothing changes);
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
ROLES = ("run_user", "shared_dir", "verify")  # the roles the local run applies to this machine
ALL_ROLES = ("host_facts", "run_user", "shared_dir", "docker", "nfs_server", "nfs_client", "spark_link", "verify",
             "preflight")
NO_OS_VARS = ("host_facts", "preflight")  # nothing distribution-specific
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
    assert inv["gpu_nodes"]["hosts"] == ["a100-1"]
    assert set(inv["run_hosts"]["children"]) == {"trainers", "servers", "gpu_nodes"}
    assert inv["spark_link"]["hosts"] == ["spark1", "spark2"]
    assert inv["nfs_server"]["hosts"] == ["nas1"]
    hostvars = inv["_meta"]["hostvars"]
    assert [hostvars[h]["spark_link_host_id"] for h in ("spark1", "spark2")] == [1, 2]
    site = yaml.safe_load((ANSIBLE / "site.yml").read_text())
    roles = {r["role"] for p in site for r in p.get("roles", [])}
    assert roles == set(ALL_ROLES), roles
    assert site[-1]["hosts"] == "localhost" and [r["role"] for r in site[-1]["roles"]] == ["preflight"]
    assert "preflight" in site[-1]["tags"] and site[-1]["become"] is False


@pytest.mark.parametrize("role", ALL_ROLES)
def test_role_layout(role):
    base = ANSIBLE / "roles" / role
    os_vars = [] if role in NO_OS_VARS else ["vars/Debian.yml", "vars/Ubuntu.yml"]
    wanted = ["defaults/main.yml", "tasks/main.yml", *os_vars]
    for rel in wanted:
        assert (base / rel).is_file(), f"roles/{role}/{rel} missing"
    defaults = yaml.safe_load((base / "defaults/main.yml").read_text())
    assert defaults and all(k.startswith(f"{role}_") for k in defaults), f"public knobs of {role} need its prefix"
    tasks = yaml.safe_load((base / "tasks/main.yml").read_text())
    flat = [t for task in tasks for t in ([task] + task.get("block", []))]
    assert any("ansible.builtin.assert" in t for t in flat), f"{role} checks nothing"
    for task in flat:
        if "ansible.builtin.assert" in task:
            that = task["ansible.builtin.assert"]["that"]
            that = that if isinstance(that, list) else [that]
            assert not any(str(t).strip().lower() in ("true", "1", "yes") for t in that), f"stub assert in {role}"


def _render(tmp_path, template: Path, variables: dict) -> str:
    """*template* rendered by Ansible's own template module on this machine."""
    out = tmp_path / template.stem
    proc = run([tool("ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m", "ansible.builtin.template",
                "-a", f"src={template} dest={out}", "-e", json.dumps({**variables,
                                                                       "ansible_python_interpreter": sys.executable})])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out.read_text()


def test_spark_link_netplan_renders_one_24_per_link(tmp_path):
    ports = [{"interface": "enp1s0f1np1", "subnet": "192.168.100.0/24"},
             {"interface": "enP2p1s0f1np1", "subnet": "192.168.101.0/24"}]
    text = _render(tmp_path, ANSIBLE / "roles/spark_link/templates/netplan.yaml.j2",
                   {"spark_link_ports": ports, "spark_link_host_id": 2, "spark_link_mtu": 9000})
    doc = yaml.safe_load(text)
    assert doc["network"]["version"] == 2 and set(doc["network"]) == {"version", "ethernets"}
    eth = doc["network"]["ethernets"]
    assert list(eth) == ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert eth["enp1s0f1np1"]["addresses"] == ["192.168.100.2/24"]
    assert eth["enP2p1s0f1np1"]["addresses"] == ["192.168.101.2/24"]
    for iface in eth.values():
        assert iface["mtu"] == 9000 and iface["dhcp4"] is False and iface["dhcp6"] is False
        assert iface["link-local"] == []  # no 169.254 address beside the static one
    assert "MTU 9000" in text.splitlines()[1]
    # the defaults say what the link's MTU is, and the role states it in the file it writes
    assert yaml.safe_load((ANSIBLE / "roles/spark_link/defaults/main.yml").read_text())["spark_link_mtu"] == 9000


def test_nfs_export_line_keeps_root_squash_for_every_client(tmp_path):
    text = _render(tmp_path, ANSIBLE / "roles/nfs_server/templates/exports.j2",
                   {"nfs_server_export_path": "/srv/grpo-deploy", "nfs_server_clients": ["192.0.2.11", "10.1.0.0/24"],
                    "nfs_server_options": "rw,sync,no_subtree_check"})
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == ["/srv/grpo-deploy 192.0.2.11(rw,sync,no_subtree_check,root_squash) "
                     "10.1.0.0/24(rw,sync,no_subtree_check,root_squash)"], text


# (role, case name, hostile variables, the value the one message must show)
HOSTILE = [
    ("run_user", "uid-0", {"run_user_uid": 0}, "run_user_uid 0"),
    ("run_user", "name-newline", {"run_user_name": "grpo\nroot"}, "run_user_name"),
    ("run_user", "home-dotdot", {"run_user_home": "/home/../etc"}, "/home/../etc"),
    ("shared_dir", "path-dollar", {"shared_dir_path": "/srv/$HOME"}, "/srv/$HOME"),
    ("shared_dir", "path-dotdot", {"shared_dir_path": "/srv/grpo/../../etc"}, "/srv/grpo/../../etc"),
    ("shared_dir", "path-leading-dash", {"shared_dir_path": "-rf"}, "-rf"),
    ("shared_dir", "path-system-dir", {"shared_dir_path": "/etc"}, '"/etc"'),
    ("docker", "user-dollar", {"docker_users": ["$(id)"]}, "$(id)"),
    ("docker", "toolkit-repo-newline", {"docker_nvidia_toolkit_repo": {"uris": "http://mirror.invalid/x\n deb y"}},
     "docker_nvidia_toolkit_repo"),
    ("nfs_server", "no-root-squash", {"nfs_server_clients": ["spark2"], "nfs_server_options": "rw,no_root_squash"},
     "rw,no_root_squash"),
    ("nfs_server", "client-newline", {"nfs_server_clients": ["spark2\n/ *(rw"]}, "spark2"),
    ("nfs_server", "no-clients", {"nfs_server_clients": []}, "nfs_server_clients []"),
    ("nfs_server", "owner-root", {"nfs_server_clients": ["spark2"], "nfs_server_owner": 0}, "nfs_server_owner/group 0"),
    ("nfs_client", "soft", {"nfs_client_server": "spark1", "nfs_client_options": "nfsvers=4.1,soft"}, "soft"),
    ("nfs_client", "server-leading-dash", {"nfs_client_server": "-oProxyCommand=x"}, "-oProxyCommand=x"),
    ("spark_link", "host-id-0", {"spark_link_ports": [{"interface": "enp1s0f1np1", "subnet": "192.168.100.0/24"}],
                                 "spark_link_host_id": 0}, "spark_link_host_id 0"),
    ("spark_link", "subnet-16", {"spark_link_ports": [{"interface": "enp1s0f1np1", "subnet": "10.0.0.0/16"}],
                                 "spark_link_host_id": 1}, "10.0.0.0/16"),
    ("spark_link", "interface-newline", {"spark_link_ports": [{"interface": "eth0\nx", "subnet": "10.0.0.0/24"}],
                                         "spark_link_host_id": 1}, "eth0"),
    ("spark_link", "mtu-too-big", {"spark_link_ports": [{"interface": "enp1s0f1np1", "subnet": "10.0.0.0/24"}],
                                   "spark_link_host_id": 1, "spark_link_mtu": 100000}, "spark_link_mtu 100000"),
    ("spark_link", "same-subnet-twice", {"spark_link_ports": [{"interface": "a", "subnet": "10.0.0.0/24"},
                                                              {"interface": "b", "subnet": "10.0.0.0/24"}],
                                         "spark_link_host_id": 1}, "one distinct /24 per link"),
    ("preflight", "no-spec", {"preflight_spec": ""}, "set preflight_spec"),
    ("preflight", "only-leading-dash", {"preflight_spec": "x.yaml", "preflight_only": ["--all"]}, '["--all"]'),
]


def test_hostile_inventory_values_are_refused_with_one_message(tmp_path):
    """Each case is a play of one playbook, run in check mode on this machine: the role's input check must fail it
    with the role's message showing the value; a case the role accepts is recorded as accepted (and fails here)."""
    plays = [{"name": "Facts", "hosts": "localhost", "connection": "local", "gather_facts": True,
              "gather_subset": ["min"], "tasks": [{"name": "Start the record", "ansible.builtin.set_fact":
                                                   {"hostile_results": {}}}]}]
    for role, case, variables, _ in HOSTILE:
        record = "{{ hostile_results | combine({'%s': %s}) }}"
        plays.append({"name": f"Case {case}", "hosts": "localhost", "connection": "local", "gather_facts": False,
                      "vars": {**variables, "grpo_nfs_kernel": False},
                      "tasks": [{"name": f"Run {role}", "block": [
                          {"name": "Apply the role", "ansible.builtin.include_role": {"name": role}},
                          {"name": "Record acceptance", "ansible.builtin.set_fact":
                              {"hostile_results": record % (case, "'ACCEPTED'")}}],
                          "rescue": [{"name": "Record the message", "ansible.builtin.set_fact":
                                      {"hostile_results": record % (case, "ansible_failed_result.msg")}}]}]})
    out = tmp_path / "results.json"
    plays.append({"name": "Write the record", "hosts": "localhost", "connection": "local", "gather_facts": False,
                  "tasks": [{"name": "Write", "ansible.builtin.copy": {"content": "{{ hostile_results | to_json }}",
                                                                     "dest": str(out), "mode": "0600"},
                             "check_mode": False}]})
    playbook = tmp_path / "hostile.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    proc = run([tool("ansible-playbook"), "-i", "localhost,", "--check", str(playbook),
                "-e", json.dumps({"ansible_python_interpreter": sys.executable})],
               env={"ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles")})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    results = json.loads(out.read_text())
    prefix = {"docker": "docker role:"}
    for role, case, _, shown in HOSTILE:
        msg = results.get(case, "")
        assert msg.startswith(prefix.get(role, f"{role}:")), f"{case}: {msg!r}"
        assert shown in msg and "\n" not in msg.replace("\\n", ""), f"{case}: {msg!r} does not show {shown!r}"
    changed = re.search(r"localhost\s*:.*changed=(\d+)", proc.stdout)
    assert changed and changed.group(1) == "1", proc.stdout[-2000:]  # the record file only: no role changed anything


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
