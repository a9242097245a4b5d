"""Hostile command-line arguments: init --hosts (an accepted list is written exactly, a refused one writes nothing),
preflight --only, and the output paths the OS would refuse (NUL, names too long, too deep, under a file, a full disk);
a traceback checked in a subprocess too, where the interpreter would print it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grpo_deploy import preflight
from grpo_deploy import spec as spec_module
from tests.hostile.helpers import assert_refused, base_data, changed, cli, dump, write_spec

INIT = ["init", "--profile", "gb10", "--engine", "trl-async"]


@pytest.mark.parametrize(("hosts", "words"), [
    ("spark1\n    shared_dir: /", ("--hosts", "control character")),
    ("-oProxyCommand=x", ("--hosts", "starts with '-'")),
    ("spark1,-oProxyCommand=x", ("--hosts", "starts with '-'")),
    ("user@@h", ("--hosts", "not a user name")),
    ("h:0", ("port must be a number from 1 to 65535",)),
    ("a b", ("not a host name",)),
    ("spark1;id", ("not a host name",)),
    ("$(id)", ("not a host name",)),
    (",".join(f"s{i}" for i in range(18)), ("at most 17 hosts",)),
    ("a,a", ("same SSH host and port",)),
    ("user@a,other@a:22", ("same SSH host and port",)),
])
def test_init_refuses_bad_hosts_and_writes_nothing(tmp_path, hosts, words):
    run = cli(INIT + [f"--hosts={hosts}", "-o", "s.yaml"], tmp_path)
    assert_refused(run, words=words)
    assert not (tmp_path / "s.yaml").exists()


def test_init_hosts_value_that_looks_like_an_option_is_a_usage_error(tmp_path):
    run = cli(INIT + ["--hosts", "-oProxyCommand=x", "-o", "s.yaml"], tmp_path)
    assert run.code == 2 and "expected one argument" in run.err and "Traceback" not in run.err
    assert not (tmp_path / "s.yaml").exists()


@pytest.mark.parametrize(("hosts", "expected"), [
    ("a,,b", [("a", "a"), ("b", "b")]),
    (" spark1 , spark2 ", [("spark1", "spark1"), ("spark2", "spark2")]),
    ("fe80::1", [("fe80--1", "fe80::1")]),
    ("[fe80::1]:2222", [("fe80--1", "[fe80::1]:2222")]),
    ("ubuntu@10.0.0.5:2222,spark2", [("10-0-0-5", "ubuntu@10.0.0.5:2222"), ("spark2", "spark2")]),
    (",", [("local", "local")]),
])
def test_init_writes_exactly_the_hosts_given(tmp_path, hosts, expected):
    run = cli(INIT + [f"--hosts={hosts}", "-o", "s.yaml"], tmp_path)
    assert run.code == 0, run.err
    loaded = spec_module.load(tmp_path / "s.yaml")
    assert [(h.name, h.address) for h in loaded.spec.hosts] == expected
    assert cli(["plan", "--json", "-f", "s.yaml"], tmp_path).code in (0, 1)


def test_preflight_only_typo_names_the_known_checks(tmp_path):
    spec = write_spec(tmp_path, base_data("cpu"))
    run = cli(["preflight", "--json", "-f", str(spec), "--only", "spce"], tmp_path)
    assert run.code == 2 and "Traceback" not in run.err
    assert "--only" in run.err and "'spce'" in run.err
    for name in preflight.names():
        assert f"'{name}'" in run.err, name


@pytest.mark.parametrize("value", ["local=lots", "local=-5", "local=1e400", "local=nan", "nohost=5GB", "=5",
                                   "local=5XB", "local"])
def test_free_space_refused_with_the_flag(tmp_path, value):
    spec = write_spec(tmp_path, base_data("cpu"))
    run = cli(["plan", "-f", str(spec), f"--free-space={value}"], tmp_path)
    assert_refused(run, words=("--free-space",))


# ------------------------------------------------------------------ fixes that belong to cli.py / render_folder.py



def test_free_space_too_large_a_number(tmp_path):
    spec = write_spec(tmp_path, base_data("cpu"))
    run = cli(["plan", "-f", str(spec), f"--free-space=local={'9' * 400}"], tmp_path)
    assert_refused(run, words=("--free-space",))


def test_render_output_with_nul(tmp_path):
    spec = write_spec(tmp_path, base_data("cpu"))
    assert_refused(cli(["render", "-f", str(spec), "-o", "a\x00b"], tmp_path), words=("-o",))


def test_render_output_name_too_long(tmp_path):
    spec = write_spec(tmp_path, base_data("cpu"))
    assert_refused(cli(["render", "-f", str(spec), "-o", "x" * 300], tmp_path), words=("-o",))


def test_render_output_under_a_file(tmp_path):
    spec = write_spec(tmp_path, base_data("cpu"))
    assert_refused(cli(["render", "-f", str(spec), "-o", "spec.yaml/x"], tmp_path), words=("-o",))


def test_render_output_too_deep(tmp_path):
    spec = write_spec(tmp_path, base_data("cpu"))
    try:
        run = cli(["render", "-f", str(spec), "-o", "x/" * 2000], tmp_path)
    except RecursionError:
        run = None
    if run is None:  # failed outside the except: pytest would format the thousand chained frames (minutes)
        pytest.fail("RecursionError", pytrace=False)
    assert_refused(run, words=("-o",))


def test_render_output_double_dash(tmp_path):
    spec = write_spec(tmp_path, base_data("cpu"))
    assert_refused(cli(["render", "-f", str(spec), "--output=--"], tmp_path), words=("-o",))


def test_render_output_under_run_is_refused_like_a_spec_path(tmp_path):
    """/run is a system tree for a spec path (runtime/values.py SYSTEM_TREES) and so for render -o."""
    spec = write_spec(tmp_path, base_data("cpu"))
    target = f"/run/grpo-deploy-hostile-{os.getpid()}"
    assert_refused(cli(["render", "-f", str(spec), "-o", target], tmp_path), words=("-o", "system directory /run"))
    assert not os.path.lexists(target)


def test_init_output_with_nul(tmp_path):
    assert_refused(cli(INIT + ["-o", "a\x00b"], tmp_path), words=("-o",))


def test_init_output_name_too_long(tmp_path):
    assert_refused(cli(INIT + ["-o", "y" * 300], tmp_path), words=("-o",))


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KB tmpfs: 16 pages of 4 KB. The gb10 pair's render takes 17 with its record, the cpu one's 11."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(disk)], check=True, timeout=30)
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True, timeout=30)


def test_render_output_on_a_full_disk_is_one_line_and_changes_nothing(tmp_path, small_disk):
    """Issue 44: a full disk leaves no half-written folder: into a new or an empty folder nothing is left behind;
    over an earlier render, that render stays byte for byte and `render --check` still passes."""
    (tmp_path / "pair.yaml").write_text(dump(base_data("gb10-pair")))
    (tmp_path / "cpu.yaml").write_text(dump(base_data("cpu")))
    empty = os.statvfs(small_disk)
    for target in (small_disk / "render", small_disk):  # a new folder, an empty one (the mount point itself)
        run = cli(["render", "-f", "pair.yaml", "-o", str(target)], tmp_path)
        assert_refused(run, words=(f"error: render -o {target}: no space left on the device (wrote ",
                                   " bytes); nothing was changed: free some space or render into another directory"))
        assert len(run.err.splitlines()) == 1, run.err
        assert os.listdir(small_disk) == [] and os.statvfs(small_disk).f_bfree == empty.f_bfree
    out = small_disk / "render"
    assert cli(["render", "-f", "cpu.yaml", "-o", str(out)], tmp_path).code == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    used = os.statvfs(small_disk).f_bfree
    run = cli(["render", "-f", "pair.yaml", "-o", str(out)], tmp_path)
    assert_refused(run, words=(f"error: render -o {out}: no space left on the device", "; nothing was changed"))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # the scratch folder gone too
    assert os.listdir(small_disk) == ["render"] and os.statvfs(small_disk).f_bfree == used
    check = cli(["render", "-f", "cpu.yaml", "-o", str(out), "--check"], tmp_path)
    assert check.code == 0 and "matches the renderer" in check.out, check.out


# ------------------------------------------------------------------ as a subprocess

def test_no_traceback_from_the_real_command(tmp_path):
    """One real process (each pays the CLI's imports, seconds): plan on numbers that used to overflow plan's
    arithmetic, where Python itself would print a traceback."""
    spec = write_spec(tmp_path, changed("cpu", {("overrides", "trl", "max_steps"): 10**30}))
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "plan", "--json", "-f", str(spec)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("error: ") and all(line.startswith("  ") for line in lines[1:]), proc.stderr
    assert any(": overrides.trl.max_steps: " in line for line in lines), proc.stderr


@pytest.mark.parametrize(("args", "flag"), [
    (["status", "--watch", "0"], "--watch"), (["status", "--watch=nan"], "--watch"),
    (["status", "--watch", "1e9"], "--watch"), (["status", "--watch=$(id)"], "--watch"),
    (["logs", "--tail", "-5"], "--tail"), (["logs", "--tail", "1e3"], "--tail"),
    (["logs", "--tail", "9999999"], "--tail"), (["logs", "--role", "server\nx"], "--role"),
    (["logs", "--role", "../trainer"], "--role"), (["logs", "--host", "-oProxyCommand=x"], "--host"),
    (["up", "--restarts", "-1"], "--restarts"), (["up", "--restarts", "11"], "--restarts"),
    (["up", "--restarts", "2\n3"], "--restarts"), (["up", "--restarts=$(id)"], "--restarts"),
])
def test_status_and_logs_flags_refused(tmp_path, args, flag):
    spec = write_spec(tmp_path, base_data("cpu"))
    run = cli([*args, "-f", str(spec)], tmp_path)
    assert_refused(run, words=(flag,))
