"""The door, round two (issue 22): files the kit reads back (links, FIFOs, devices, huge, not UTF-8), secrets and
foreign file contents never echoed, plan in constant time in max_steps, concurrent renders, checkpoint folders with
links, and the value types tightened (bidi, ASCII digits, OCI length, YAML 1.1 numbers, ranges, contradicting pairs)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_deploy import plan as plan_mod
from grpo_deploy.common.readback import ReadRefused, read_text
from grpo_deploy.common.shown import shown
from grpo_deploy.render.folder import RECORD, diff_tree, read_record, write_tree
from grpo_deploy.render.k8s_overlay import problems as k8s_problems
from grpo_deploy.runtime.storage import checkpoints
from tests.hostile.helpers import assert_refused, base_data, changed, cli, dump, render

TOKEN = "hf_Zq8PlantedTokenValue9xYw"


# ------------------------------------------------------------------ reading what the kit did not write

def _specials(tmp):
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    link = tmp / "link"
    link.symlink_to("/etc/hostname")
    sparse = tmp / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(6 << 30)  # 6 GB, no blocks
    latin = tmp / "latin"
    latin.write_bytes(b"caf\xe9\n")
    return {"fifo": (fifo, "FIFO"), "link": (link, "symbolic link"), "device": ("/dev/zero", "character device"),
            "sparse": (sparse, "bytes"), "latin": (latin, "not UTF-8")}


def test_spec_that_is_a_fifo_link_device_or_huge_is_one_line_within_seconds(tmp_path):
    for name, (path, word) in _specials(tmp_path).items():
        start = time.monotonic()
        run = cli(["render", "-f", str(path), "-o", str(tmp_path / "out")], tmp_path)
        assert time.monotonic() - start < 10, name
        assert_refused(run, words=(word,))
        assert len(run.problems) == 1, run.err
        assert not (tmp_path / "out").exists()


def test_render_check_reads_back_through_no_link_fifo_or_device(tmp_path):
    run, out = render(tmp_path, base_data("cpu"))
    assert run.code == 0, run.err
    assert cli(["render", "--check", "-f", str(tmp_path / "spec.yaml"), "-o", str(out)], tmp_path).code == 0
    victims = sorted(r for r in read_record(out) if r.endswith(".env"))[:1] + ["config/server.args"]
    replacements = [lambda p: p.symlink_to("/dev/zero"), lambda p: os.mkfifo(p)]
    for rel, make in zip(victims, replacements, strict=False):
        (out / rel).unlink()
        make(out / rel)
    start = time.monotonic()
    run = cli(["render", "--check", "-f", str(tmp_path / "spec.yaml"), "-o", str(out)], tmp_path)
    assert time.monotonic() - start < 10
    assert run.code == 1 and "Traceback" not in run.err, run.err
    for rel in victims:
        assert f"differs  {rel}" in run.out, run.out


@pytest.mark.parametrize("kind", ["link", "fifo", "sparse", "latin"])
def test_checkpoint_state_files_are_read_bounded(tmp_path, kind):
    ck = tmp_path / "checkpoint-2"
    ck.mkdir()
    special = _specials(tmp_path)[kind][0]
    os.replace(special, ck / checkpoints.STATE_FILE) if kind != "link" else \
        (ck / checkpoints.STATE_FILE).symlink_to("/dev/zero")
    start = time.monotonic()
    found = checkpoints.list_checkpoints(str(tmp_path), "trl")
    assert time.monotonic() - start < 5
    assert [c.state for c in found] == ["half-written"] and "unreadable" in found[0].reason


def test_reader_refuses_each_kind_with_its_name(tmp_path):
    for _name, (path, word) in _specials(tmp_path).items():
        with pytest.raises(ReadRefused) as info:
            read_text(path, 1 << 20, "a test file")
        assert word in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------ secrets and foreign contents never echoed

def test_planted_token_in_a_yaml_error_is_not_echoed(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(dump(base_data("cpu")).replace("seed: 0", f"seed: !!int {TOKEN}"))
    run = cli(["plan", "-f", str(spec)], tmp_path)
    assert_refused(run)
    assert TOKEN not in run.err and TOKEN[:8] not in run.err


def test_a_link_or_a_password_file_is_not_echoed(tmp_path):
    shadow = tmp_path / "shadow"
    line = "root: $6$saltsalt$Qm9vYmFyYmF6cXV4cXV1eHF1dXhxdXV4cXV1eA"
    shadow.write_text(line + "\n")
    (tmp_path / "spec.yaml").symlink_to(shadow)
    for path in (tmp_path / "spec.yaml", shadow):
        run = cli(["plan", "-f", str(path)], tmp_path)
        assert_refused(run)
        assert "$6$" not in run.err and "saltsalt" not in run.err, run.err


@given(st.text(min_size=30, max_size=200))
@settings(max_examples=200, deadline=None)
def test_shown_never_echoes_past_a_short_prefix(value):
    text = shown(value)
    assert "\n" not in text and len(text) < 12 * 10 + 60  # 12 characters, each escaped to at most 10
    assert value not in text and value[12:] not in text


def test_long_values_are_not_echoed_whole(tmp_path):
    secret_shaped = "x" * 10 + "TAILTAILTAILTAIL"
    run, _ = render(tmp_path, changed("cpu", {("run", "name"): secret_shaped}))
    assert_refused(run, key="run.name")
    assert "TAILTAIL" not in run.err


# ------------------------------------------------------------------ plan arithmetic

def _plan_time(tmp, steps: int) -> tuple[float, str]:
    data = changed("cpu", {("overrides", "trl", "max_steps"): steps, ("checkpoints", "save_every"): 1,
                           ("checkpoints", "keep"): "all"})
    (tmp / f"{steps}.yaml").write_text(dump(data))
    start = time.perf_counter()
    run = cli(["plan", "--json", "-f", str(tmp / f"{steps}.yaml"), "--free-space", "local=1TB"], tmp)
    return time.perf_counter() - start, run.out


def test_plan_runs_in_constant_time_in_max_steps(tmp_path):
    small, _ = _plan_time(tmp_path, 100)
    big, out = _plan_time(tmp_path, 1_000_000)
    disk = json.loads(out)["disk"]
    assert disk["save_count"] == 1_000_000 and len(disk["save_steps"]) <= plan_mod.SHOWN_SAVES
    assert big < max(10 * small, 2.0), (small, big)


@given(every=st.integers(1, 40), steps=st.integers(0, 400), interval=st.integers(1, 30), growth=st.integers(0, 5000),
       base=st.integers(0, 10**6), last=st.booleans())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_closed_form_window_equals_the_walk(every, steps, interval, growth, base, last):
    regular = steps // every
    sched = plan_mod.Schedule(every, steps, regular, bool(last and steps % every))
    sizes = plan_mod._Sizes(sched, base, growth, interval)
    walk = [base + growth * (sched.step(i) // interval) for i in range(1, sched.count + 1)]
    for lo in range(1, sched.count + 1, max(1, sched.count // 7)):
        for hi in range(lo, sched.count + 1, max(1, sched.count // 5)):
            assert sizes.window(lo, hi) == sum(walk[lo - 1:hi])


@pytest.mark.parametrize(("value", "words"), [
    ("abc", ("trl.logging_steps",)), (1e308, ("logging_steps",)), (0, ("logging_steps",)), (2.5, ("whole number",)),
])
def test_logging_steps_refused_not_a_traceback(tmp_path, value, words):
    run, _ = render(tmp_path, changed("cpu", {("overrides", "trl", "logging_steps"): value}))
    assert_refused(run, words=words)


def test_fractional_logging_steps_is_a_valid_ratio(tmp_path):
    run, _ = render(tmp_path, changed("cpu", {("overrides", "trl", "logging_steps"): 0.25}))
    assert run.code == 0, run.err
    spec = tmp_path / "spec.yaml"
    assert cli(["plan", "-f", str(spec)], tmp_path).code in (0, 1)


# ------------------------------------------------------------------ two renders into one folder

def test_concurrent_renders_leave_record_and_folder_in_agreement(tmp_path):
    out = tmp_path / "out"
    variants = [{f"f{i}/a.txt": f"{n}-{i}\n" for i in range(n % 3 + 1)} for n in range(8)]
    errors: list[BaseException] = []

    def one(files):
        try:
            write_tree(files, out)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(v,)) for v in variants]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    record = read_record(out)
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {RECORD}
    assert set(record) == on_disk
    for rel, digest in record.items():  # every listed file holds what the record says the kit wrote
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest
    assert any(diff_tree(v, out) == [] for v in variants)  # the folder is exactly one whole render


def test_k8s_check_reads_generated_files_without_following_or_blocking(tmp_path):
    overlay = tmp_path / "ov"
    shutil.copytree(Path(__file__).resolve().parents[2] / "k8s" / "h200", overlay)
    (overlay / "generated" / "params.env").unlink()
    os.mkfifo(overlay / "generated" / "params.env")
    (overlay / "generated" / "server.args").unlink()
    (overlay / "generated" / "server.args").symlink_to("/dev/zero")
    start = time.monotonic()
    found = k8s_problems(overlay)
    assert time.monotonic() - start < 10
    assert any("generated/ differs" in line and "params.env" in line for line in found), found


# ------------------------------------------------------------------ checkpoint folders with links

def _complete(folder):
    folder.mkdir()
    (folder / checkpoints.STATE_FILE).write_text("{}")


def test_quarantine_link_out_of_the_run_moves_nothing(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    _complete(run / "checkpoint-2")
    (run / "checkpoint-4").mkdir()  # half-written
    (run / checkpoints.QUARANTINE_DIR).symlink_to(outside)
    with pytest.raises(checkpoints.CheckpointRefused):
        checkpoints.prune(str(run), keep=1)
    assert sorted(os.listdir(run)) == ["checkpoint-2", "checkpoint-4", "quarantine"] and not os.listdir(outside)
    assert checkpoints._main(["prune", str(run), "--keep", "1"]) == 2


def test_a_checkpoint_that_is_a_link_is_never_followed_or_removed(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    _complete(elsewhere)
    (run / "checkpoint-1").symlink_to(elsewhere)
    for step in (2, 3, 4):
        _complete(run / f"checkpoint-{step}")
    result = checkpoints.prune(str(run), keep=1)
    assert [c.step for c in result.removed] == [2, 3]
    assert (run / "checkpoint-1").is_symlink() and (elsewhere / checkpoints.STATE_FILE).exists()
    states = {c.step: c.state for c in checkpoints.list_checkpoints(str(run), "trl")}
    assert states == {1: "link", 4: "complete"}


def test_two_prunes_at_once_wait_for_each_other(tmp_path):
    for step in range(1, 7):
        _complete(tmp_path / f"checkpoint-{step}")
    results, errors = [], []

    def one():
        try:
            results.append(checkpoints.prune(str(tmp_path), keep=2))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-5", "checkpoint-6"]


# ------------------------------------------------------------------ values that still passed

@pytest.mark.parametrize(("changes", "key", "words"), [
    ({("hosts", 0, "address"): "spark1:٢٢"}, "hosts[0].address", ("port",)),
    ({("overrides", "vllm", "env", "EXTRA_VAR"): "abc\u202edef"}, None, ("bidirectional",)),
    ({("images", "server"): "a" * 10_000}, "images.server", ("OCI",)),
    ({("run", "seed"): 10**40}, "run.seed", ("less than or equal",)),
    ({("checkpoints", "save_every"): 2**63}, "checkpoints.save_every", ("less than or equal",)),
    ({("overrides", "trl", "warmup_steps"): 10**40}, "overrides.trl.warmup_steps", ("within 64 bits",)),
    ({("overrides", "trl", "vllm_server_timeout"): 1e300}, "overrides.trl.vllm_server_timeout",
     ("less than or equal",)),
])
def test_values_that_passed_are_refused(tmp_path, changes, key, words):
    run, out = render(tmp_path, changed("cpu", changes))
    assert_refused(run, key=key, words=words)
    assert not out.exists()


@pytest.mark.parametrize(("text", "words"), [
    ("uid: 01000", ("run.uid", "octal")), ("uid: 1:30", ("run.uid", "base-60")), ("uid: 0x3e8", ("run.uid",)),
    ("uid: 1_000", ("run.uid", "'_'")),
])
def test_yaml_11_numbers_are_refused(tmp_path, text, words):
    spec = tmp_path / "spec.yaml"
    spec.write_text(dump(base_data("cpu")).replace("uid: 1000", text, 1))
    run = cli(["plan", "-f", str(spec)], tmp_path)
    assert_refused(run, words=words)


def test_short_planted_credential_is_caught(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_PRIVATE_KEY", "k3y9zz")
    run, _ = render(tmp_path, changed("cpu", {("run", "name"): "exp-k3y9zz"}))
    assert_refused(run, key="run.name", words=("$MY_PRIVATE_KEY",))
    assert "k3y9zz" not in run.err


def test_one_ssh_host_for_two_hosts_is_refused(tmp_path):
    data = base_data("gb10-pair")
    data["hosts"][1]["address"] = data["hosts"][0]["address"]
    run, _ = render(tmp_path, data)
    assert_refused(run, key="hosts[1].address", words=("same SSH host and port",))


@pytest.mark.parametrize("hosts", ["spark_1,spark-1", "a.lan,a-lan", "host1:22,host1:2222", "Spark1,spark-1"])
def test_distinct_host_aliases_are_accepted(tmp_path, hosts):
    run = cli(["init", "--profile", "gb10", "--engine", "trl-async", "--hosts", hosts, "-o", "s.yaml"], tmp_path)
    assert run.code == 0, run.err
    assert cli(["render", "-f", "s.yaml", "-o", "out"], tmp_path).code == 0


BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


@given(head=st.text("abcXYZ019-_.", max_size=8), mark=st.sampled_from(BIDI), tail=st.text("abc019", max_size=8))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_bidi_control_in_an_env_value_is_refused(tmp_path_factory, head, mark, tail):
    tmp = tmp_path_factory.mktemp("bidi")
    run, out = render(tmp, changed("cpu", {("overrides", "vllm", "env", "EXTRA_VAR"): head + mark + tail}))
    assert_refused(run, words=("bidirectional",))
    assert not out.exists()


@given(st.text("0123456789", min_size=1, max_size=6))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_leading_zero_number_is_refused_by_key(tmp_path_factory, n):
    """0755 is octal to YAML 1.1 (refused at the door), 0189 is text (refused by type): both say octal."""
    tmp = tmp_path_factory.mktemp("octal")
    spec = tmp / "spec.yaml"
    spec.write_text(dump(base_data("cpu")).replace("uid: 1000", f"uid: 0{n}", 1))
    assert_refused(cli(["plan", "-f", str(spec)], tmp), words=("run.uid", "octal"))


def test_a_filesystem_without_directory_flock_falls_back_to_a_lock_file(tmp_path, monkeypatch):
    """NFS refuses flock on a directory opened read-only (EBADF): the O_EXCL lock file stands in, and a second
    writer is refused while it exists; nothing is left behind."""
    import errno
    import fcntl

    from grpo_deploy.common import dirlock

    def no_flock(fd, op):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with dirlock.locked(tmp_path, "a test"):
        assert (tmp_path / dirlock.LOCK_FILE).exists()
        with pytest.raises(dirlock.Busy, match="remove"):
            with dirlock.locked(tmp_path, "a test", wait_s=0.2):
                pass
    assert not (tmp_path / dirlock.LOCK_FILE).exists()
    for step in (1, 2, 3):
        _complete(tmp_path / f"checkpoint-{step}")
    assert [c.step for c in checkpoints.prune(str(tmp_path), keep=1).removed] == [1, 2]
