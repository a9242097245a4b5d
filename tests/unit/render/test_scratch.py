"""Tests of grpo_deploy.render.scratch through write_tree: a write is all or nothing. An interrupt or a failure at any
step of a re-render leaves the earlier render byte for byte (files the kit did not write too, the same folders, a true
record, no scratch folder); a crash mid-move is rolled back by the next write; a new target is all there or absent."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

import pytest

from grpo_deploy.render import folder as render_folder
from grpo_deploy.render import scratch

EARLIER = {"config/a.env": "A=1\n", "config/b.args": "--b\n", "hosts/x.env": "X=1\n", "gone/deep/f": "stale\n",
           "top.json": "{}\n"}
LATER = {"config/a.env": "A=2\n", "config/b.args": "--b\n", "hosts/x.env": "X=2\n", "new/sub/c": "c\n",
         "top.json": '{"v": 2}\n'}


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under *folder*: a file's bytes and mode, a folder's inode, a link's target."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = os.lstat(path)
        rel = path.relative_to(folder).as_posix()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", st.st_ino)
        else:
            out[rel] = ("file", path.read_bytes(), stat.S_IMODE(st.st_mode))
    return out


def record_is_true(out: Path) -> bool:
    """Every file the record lists holds what it says; every file of the folder that is not listed is a foreign one."""
    record = render_folder.read_record(out)
    return record is not None and all(
        (out / rel).is_file() and hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest
        for rel, digest in record.items())


def record_of(files: dict[str, str]) -> str:
    return render_folder.RECORD_HEADER + "\n" + "".join(
        f"{hashlib.sha256(text.encode()).hexdigest()}  {rel}\n" for rel, text in sorted(files.items()))


def scratch_folders(*folders: Path) -> list[str]:
    return [p.name for f in folders for p in f.iterdir() if ".render-" in p.name or p.name.startswith(scratch.INSIDE)]


def earlier_render(tmp_path: Path) -> Path:
    """An earlier render with a user's file beside it, a listed file the user edited and a stale listed file."""
    out = tmp_path / "out"
    render_folder.write_tree(EARLIER, out)
    (out / "config" / "mine.txt").write_text("the user's\n")
    (out / "top.json").chmod(0o600)
    return out


def steps_of(files: dict[str, str], out: Path) -> list[tuple[str, str]]:
    """The hook's calls of a write of *files* into a copy of what *out* holds now, by a dry run in a twin folder."""
    twin = out.parent / "twin"
    render_folder.write_tree(EARLIER, twin)
    (twin / "config" / "mine.txt").write_text("the user's\n")
    calls: list[tuple[str, str]] = []
    render_folder.write_tree(files, twin, on_write=lambda step, rel: calls.append((step, rel)))
    return calls


def test_an_interrupt_at_any_step_of_a_rerender_leaves_the_earlier_render_byte_for_byte(tmp_path):
    out = earlier_render(tmp_path)
    before = snapshot(out)
    calls = steps_of(LATER, out)
    assert ("move", "gone/deep/f") in calls and calls[-1] == ("move", render_folder.RECORD)  # the record moves last
    assert [s for s, _ in calls] == ["stage"] * 6 + ["move"] * 7
    for n in range(len(calls)):
        seen: list[tuple[str, str]] = []

        def interrupt(step, rel, seen=seen, n=n):
            seen.append((step, rel))
            if len(seen) == n + 1:
                raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            render_folder.write_tree(LATER, out, on_write=interrupt)
        assert snapshot(out) == before, f"interrupted at {calls[n]}"
        assert record_is_true(out) and scratch_folders(tmp_path, out) == []
    render_folder.write_tree(LATER, out)  # and uninterrupted, the later render in the same folders
    after = snapshot(out)
    assert after["config"] == before["config"] and after["config/mine.txt"] == before["config/mine.txt"]
    assert after["top.json"] == ("file", b'{"v": 2}\n', 0o600) and "gone" not in after and record_is_true(out)


def test_a_failure_of_the_system_at_any_step_is_one_line_and_changes_nothing(tmp_path):
    out = earlier_render(tmp_path)
    before = snapshot(out)
    for failing, why in (("stage", errno.ENOSPC), ("move", errno.EIO)):
        def fail(step, rel, failing=failing, why=why):
            if step == failing and rel == "hosts/x.env":
                raise OSError(why, os.strerror(why))
        with pytest.raises(render_folder.WriteFailed) as caught:
            render_folder.write_tree(LATER, out, on_write=fail)
        message = str(caught.value)
        assert "\n" not in message and snapshot(out) == before and scratch_folders(tmp_path, out) == []
        total = sum(len(t) for t in LATER.values()) + len(record_of(LATER))
        if why == errno.ENOSPC:  # a and b were staged before x
            assert message == (f"{out}: no space left on the device (wrote 8 of {total} bytes); nothing was "
                               "changed: free some space or render into another directory")
        else:
            assert message == f"{out}: input/output error (wrote {total} of {total} bytes); nothing was changed"


@pytest.mark.parametrize("at", [0, 3, 6])
def test_an_interrupted_render_into_a_new_folder_leaves_nothing(tmp_path, at):
    out = tmp_path / "new" / "deeper" / "out"
    calls = []

    def interrupt(step, rel):
        calls.append(rel)
        if len(calls) == at + 1:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        render_folder.write_tree(LATER, out, on_write=interrupt)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its scratch folder nor the parents made for it
    render_folder.write_tree(LATER, out)
    assert record_is_true(out) and sorted(p.name for p in out.parent.iterdir()) == ["out"]


def crash(files: dict[str, str], out: Path, at: tuple[str, str]) -> None:
    """write_tree in a child process that dies (os._exit: no clean-up, as SIGKILL) at the hook's call *at*."""
    pid = os.fork()
    if pid == 0:
        def die(step, rel):
            if (step, rel) == at:
                os._exit(9)
        try:
            render_folder.write_tree(files, out, on_write=die)
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] >> 8 == 9


@pytest.mark.parametrize("at", [("move", "hosts/x.env"), ("move", "new/sub/c"), ("move", "gone/deep/f"),
                                ("move", render_folder.RECORD), ("stage", "top.json")])
def test_a_crash_mid_write_is_rolled_back_by_the_next_write(tmp_path, at):
    out = earlier_render(tmp_path)
    before = snapshot(out)
    crash(LATER, out, at)
    left = scratch_folders(out)
    assert len(left) == 1  # the crash left its scratch folder
    if at[0] == "move":
        assert not record_is_true(out)  # a mix: files moved in, the earlier record still in place
    scratch.recover(out)  # what the next write does first, under the folder's lock
    assert snapshot(out) == before and record_is_true(out) and scratch_folders(out) == []
    crash(LATER, out, at)
    render_folder.write_tree(LATER, out)
    assert render_folder.diff_tree(LATER, out) == ["extra    config/mine.txt"] and record_is_true(out)
    assert scratch_folders(out) == []


def test_a_crash_past_the_commit_point_is_cleaned_up_not_rolled_back(tmp_path):
    out = earlier_render(tmp_path)
    crash(LATER, out, ("move", render_folder.RECORD))
    left = out / scratch_folders(out)[0]
    os.replace(left / "new" / render_folder.RECORD, out / render_folder.RECORD)  # the commit point, then the crash
    scratch.recover(out)
    assert render_folder.diff_tree(LATER, out) == ["extra    config/mine.txt"] and record_is_true(out)
    assert not (out / "gone").exists() and scratch_folders(out) == []  # the stale file's folders went too


def test_a_crash_of_a_render_into_a_new_folder_leaves_a_scratch_folder_the_next_write_removes(tmp_path):
    out = tmp_path / "out"
    crash(LATER, out, ("move", "."))
    assert not out.exists() and len(scratch_folders(tmp_path)) == 1
    render_folder.write_tree(LATER, out)
    assert scratch_folders(tmp_path) == [] and record_is_true(out)


def test_without_hard_links_the_old_files_are_moved_aside_and_put_back(tmp_path, monkeypatch):
    out = earlier_render(tmp_path)
    before = snapshot(out)

    def no_link(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "link", no_link)  # a filesystem without hard links (vfat, some FUSE mounts)
    for rel in ("hosts/x.env", render_folder.RECORD):
        def interrupt(step, name, rel=rel):
            if (step, name) == ("move", rel):
                raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            render_folder.write_tree(LATER, out, on_write=interrupt)
        assert snapshot(out) == before and scratch_folders(out) == []
    render_folder.write_tree(LATER, out)
    assert render_folder.diff_tree(LATER, out) == ["extra    config/mine.txt"] and record_is_true(out)


def test_what_only_looks_like_a_scratch_folder_is_left_alone(tmp_path):
    out = earlier_render(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / render_folder.RECORD).write_text("x\n")
    looks = [out / f"{scratch.INSIDE}{'0' * 16}", tmp_path / f".out.render-{'1' * 16}"]
    for link in looks:
        link.symlink_to(elsewhere)  # a link named like one: never followed, never removed
    (out / f"{scratch.INSIDE}notours").mkdir()  # not the kit's name pattern
    render_folder.write_tree(LATER, out)
    assert all(link.is_symlink() for link in looks) and (out / f"{scratch.INSIDE}notours").is_dir()
    assert (elsewhere / render_folder.RECORD).read_text() == "x\n"


def test_a_scratch_folder_of_another_user_is_not_trusted(tmp_path, monkeypatch):
    out = earlier_render(tmp_path)
    render_folder.write_tree(LATER, out)
    crash(EARLIER, out, ("move", "top.json"))  # gone/deep/f moved in, the record not
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)  # the crashed write's scratch folder: another user's now
    with pytest.raises(render_folder.WriteRefused, match="gone/deep/f exists and is not a file this kit wrote"):
        render_folder.write_tree(EARLIER, out)  # not trusted, not rolled back: the file moved in is not the record's
    assert len(scratch_folders(out)) == 1
    monkeypatch.undo()
    render_folder.write_tree(EARLIER, out)  # this user's again: rolled back, then written
    assert scratch_folders(out) == [] and record_is_true(out) and (out / "gone" / "deep" / "f").read_text() == "stale\n"
