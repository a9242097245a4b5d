"""`grpo-deploy render -o DIR` writes only into a new or empty directory or an earlier render of this kit, and never
deletes or overwrites what the kit did not write: each refusal is one line, exit 2, nothing written. A full disk is
one such line; it, Ctrl-C or SIGTERM mid-write leaves the earlier render whole."""

from __future__ import annotations

import errno
import functools
import os
import re
import signal
from pathlib import Path

import pytest

from grpo_deploy import cli
from grpo_deploy.cli import main
from grpo_deploy.render.folder import RECORD, RECORD_HEADER


def tree(folder: Path) -> dict[str, str]:
    """Every file and link under *folder* (a link as "-> target"), by relative path."""
    return {p.relative_to(folder).as_posix(): f"-> {p.readlink()}" if p.is_symlink() else p.read_text()
            for p in sorted(folder.rglob("*")) if p.is_symlink() or p.is_file()}


def render(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["render", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused(capsys, *args: str) -> str:
    """The one error line of a refused render (exit 2)."""
    code, out, err = render(capsys, *args)
    assert code == 2, (out, err)
    lines = [ln for ln in err.splitlines() if not ln.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def init(name: str, *hosts: str) -> Path:
    assert main(["init", "--profile", "gb10", "--engine", "trl-async", "--hosts", ",".join(hosts), "-o", name]) == 0
    return Path(name)


@pytest.mark.parametrize("existing", [False, True])
def test_a_new_or_empty_directory_gets_the_render_and_its_record(cwd, capsys, existing):
    if existing:
        (cwd / "out").mkdir()
    code, out, _ = render(capsys, "-o", "out")
    assert code == 0 and f"into {cwd / 'out'}" in out
    files = tree(cwd / "out")
    assert "hosts/local.env" in files and "config/trainer.yaml" in files and "MANIFEST" not in files
    record = files[RECORD].splitlines()
    assert record[0] == RECORD_HEADER and sorted(ln.split("  ", 1)[1] for ln in record[1:]) == sorted(
        set(files) - {RECORD})
    assert render(capsys, "-o", "out", "--check")[0] == 0  # the record is not "extra"
    assert sorted(p.name for p in cwd.iterdir()) == ["out"]  # nothing beside it


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_foreign_manifest_does_not_make_a_directory_the_kits(cwd, capsys, kind):
    mine = cwd / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    if kind == "file":
        (mine / "MANIFEST").write_text("include *.tex\n")
    else:
        (mine / "MANIFEST").mkdir()
        (mine / "MANIFEST" / "keep").write_text("k")
    before = tree(mine)
    line = refused(capsys, "-o", "mine")
    assert line == (f"error: {mine} is not empty and holds no earlier grpo-deploy render (no {RECORD} record); "
                    "choose a new or empty directory")
    assert tree(mine) == before


def test_a_link_to_a_directory_is_refused_and_its_target_untouched(cwd, capsys):
    assert render(capsys, "-o", "real")[0] == 0  # even an earlier render is not written through a link
    before = tree(cwd / "real")
    (cwd / "link").symlink_to(cwd / "real")
    line = refused(capsys, "-o", "link/")
    assert line.startswith("error: -o link/ is a symbolic link;") and "pass a new path or the directory itself" in line
    assert tree(cwd / "real") == before and (cwd / "link").is_symlink()


def test_the_current_directory_is_refused(cwd, capsys):
    spec = init("grpo-deploy.yaml", "spark1")
    text = spec.read_text()
    for out in (".", str(cwd)):
        line = refused(capsys, "-o", out)
        assert line == (f"error: -o {out} is the current directory; render into a new or empty directory "
                        "(e.g. -o render)")
    assert sorted(p.name for p in cwd.iterdir()) == ["grpo-deploy.yaml"] and spec.read_text() == text


def test_a_directory_holding_the_spec_is_refused_at_any_depth(cwd, capsys):
    assert render(capsys, "-o", "proj")[0] == 0  # an earlier render: only the spec inside it stops this one
    (cwd / "proj" / "sub").mkdir()
    spec = init("proj/sub/s.yaml", "spark1")
    before = tree(cwd / "proj")
    line = refused(capsys, "-f", str(spec), "-o", "proj")
    assert line == "error: -o proj holds the spec being read (proj/sub/s.yaml); render into a directory outside it"
    assert tree(cwd / "proj") == before


def test_an_existing_file_and_system_directories_are_refused(cwd, capsys):
    (cwd / "out.txt").write_text("mine")
    line = refused(capsys, "-o", "out.txt")
    assert line == "error: -o out.txt is an existing file, not a directory; pass a new or empty directory"
    assert (cwd / "out.txt").read_text() == "mine"
    assert refused(capsys, "-o", "/") == "error: -o / is the root directory; render into a directory of your own"
    for target, system in (("/etc/grpo", "/etc"), ("/usr/local/share/grpo", "/usr"), ("/proc", "/proc")):
        line = refused(capsys, "-o", target)
        assert line == f"error: -o {target} is under the system directory {system}; render into a directory of your own"
    assert not Path("/etc/grpo").exists() and not Path("/usr/local/share/grpo").exists()


def test_a_rerender_removes_stale_kit_files_and_keeps_the_users(cwd, capsys):
    assert render(capsys, "-f", str(init("two.yaml", "spark1", "spark2")), "-o", "out")[0] == 0
    out = cwd / "out"
    assert (out / "hosts" / "spark2.env").exists()
    (out / "NOTES.md").write_text("my notes")
    (out / "hosts" / "extra.env").write_text("A=1\n")
    code, stdout, _ = render(capsys, "-f", str(init("one.yaml", "spark1")), "-o", "out")
    assert code == 0
    files = tree(out)
    assert "hosts/spark2.env" not in files and "hosts/spark2.gpu.yaml" not in files  # the kit's, no longer rendered
    assert files["NOTES.md"] == "my notes" and files["hosts/extra.env"] == "A=1\n"  # the user's
    assert "hosts/spark1.env" in files
    code, stdout, _ = render(capsys, "-f", "one.yaml", "-o", "out", "--check")
    assert code == 1 and "extra    NOTES.md" in stdout and "extra    hosts/extra.env" in stdout
    assert RECORD not in stdout and "missing" not in stdout and "differs" not in stdout


def test_a_render_file_replaced_by_a_link_is_refused_and_its_pointee_untouched(cwd, capsys):
    assert render(capsys, "-o", "out")[0] == 0
    precious = cwd / "precious.env"
    precious.write_text("SECRET=1\n")
    target = cwd / "out" / "hosts" / "local.env"
    target.unlink()
    target.symlink_to(precious)
    before = tree(cwd / "out")
    line = refused(capsys, "-o", "out")
    assert line == (f"error: {target} is a symbolic link where the render writes a file (grpo-deploy does not write "
                    "through links); move it away or choose another directory")
    assert tree(cwd / "out") == before and precious.read_text() == "SECRET=1\n"


def test_a_file_the_record_does_not_list_is_not_overwritten(cwd, capsys):
    out = cwd / "out"
    out.mkdir()
    assert render(capsys, "-o", "out")[0] == 0
    record = out / RECORD
    kept = [ln for ln in record.read_text().splitlines() if not ln.endswith("  resolved.json")]
    record.write_text("\n".join(kept) + "\n")
    (out / "resolved.json").write_text("the user's")
    before = tree(out)
    line = refused(capsys, "-o", "out")
    assert line == (f"error: {out / 'resolved.json'} exists and is not a file this kit wrote (the earlier render's "
                    "record does not list it); move it away or choose another directory")
    assert tree(out) == before


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_rerender_leaves_the_earlier_render_whole(cwd, capsys, monkeypatch, how):
    """Ctrl-C (KeyboardInterrupt) or a SIGTERM sent while the 3rd file moves in: exit 130, the earlier render byte for
    byte with the user's file, `render --check` of the earlier spec clean, no scratch folder."""
    two, one = init("two.yaml", "spark1", "spark2"), init("one.yaml", "spark1")
    assert render(capsys, "-f", str(two), "-o", "out")[0] == 0
    out = cwd / "out"
    (out / "NOTES.md").write_text("my notes")
    before = tree(out)
    moves = []

    def interrupt(step, rel):
        if step == "move":
            moves.append(rel)
            if len(moves) == 3:
                if how == "ctrl-c":
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signal.SIGTERM)  # render turns it into the same roll back
    monkeypatch.setattr(cli, "write_tree", functools.partial(cli.write_tree, on_write=interrupt))
    ignored = []

    def ignore(signum, frame):  # the test's own handler: a render that set none would go on and finish
        ignored.append(signum)
    outside = signal.signal(signal.SIGTERM, ignore)
    try:
        code, _, err = render(capsys, "-f", str(one), "-o", "out")
        restored = signal.getsignal(signal.SIGTERM) is ignore
    finally:
        signal.signal(signal.SIGTERM, outside)
    assert restored and ignored == []  # render's handler took the signal, then this one was put back
    assert (code, err.strip().splitlines()[-1]) == (130, "interrupted") and len(moves) == 3
    assert tree(out) == before
    assert sorted(p.name for p in cwd.iterdir()) == ["one.yaml", "out", "two.yaml"]
    code, stdout, _ = render(capsys, "-f", str(two), "-o", "out", "--check")
    assert code == 1 and stdout.splitlines()[1:-1] == ["  extra    NOTES.md"]  # the user's file, nothing else


def test_a_full_disk_is_one_line_exit_2_and_changes_nothing(cwd, capsys, monkeypatch):
    """The disk fills while the 2nd file is staged (the real full disk, a 64 KB tmpfs, is tests/hostile's, as root)."""
    assert render(capsys, "-o", "out")[0] == 0
    before = tree(cwd / "out")
    staged = []

    def full(step, rel):
        staged.append(rel)
        if len(staged) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(cli, "write_tree", functools.partial(cli.write_tree, on_write=full))
    line = refused(capsys, "-f", str(init("one.yaml", "spark1")), "-o", "out")
    assert re.fullmatch(r"error: render -o out: no space left on the device \(wrote [1-9]\d* of [1-9]\d* bytes\); "
                        r"nothing was changed: free some space or render into another directory", line), line
    assert tree(cwd / "out") == before and sorted(p.name for p in cwd.iterdir()) == ["one.yaml", "out"]
