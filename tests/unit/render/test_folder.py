"""Tests of grpo_deploy.render.folder: writing a render to a folder (the record, what is refused, what stays), diffing,
reading env files."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from grpo_deploy import render, spec
from grpo_deploy.render import folder as render_folder
from grpo_deploy.spec import new_spec, resolve


def test_parse_env_round_trips_a_rendered_server_env():
    text = new_spec.spec_text("gb10", "trl-async", []).replace(
        "overrides: {}", "overrides: {vllm: {env: {XFLAGS: 'a=b c', FLAG: true}}}")
    text = render.render_files(resolve.resolve(spec.loads(text)))["config/server.env"]
    env = render_folder.parse_env(text)
    assert env["GRPO_ROLE"] == "server" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert env["XFLAGS"] == "a=b c" and env["FLAG"] == "1"  # split on the first '=' only
    kept = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert [f"{k}={v}" for k, v in env.items()] == kept  # every KEY=VALUE line, in order, nothing else
    assert render_folder.parse_env("# c\n\nA=1\n") == {"A": "1"}
    with pytest.raises(ValueError, match="line 2"):
        render_folder.parse_env("A=1\nnot an assignment\n")


def tree(folder) -> dict[str, str]:
    """Every file under *folder* (links as "-> target"), by relative path."""
    return {p.relative_to(folder).as_posix(): f"-> {p.readlink()}" if p.is_symlink() else p.read_text()
            for p in sorted(folder.rglob("*")) if p.is_symlink() or p.is_file()}


def digests(files: dict[str, str]) -> dict[str, str]:
    return {rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in files.items()}


def record_of(files: dict[str, str]) -> str:
    """The record write_tree leaves after writing *files*."""
    return render_folder.RECORD_HEADER + "\n" + "".join(f"{d}  {rel}\n" for rel, d in sorted(digests(files).items()))


def test_write_tree_records_what_it_wrote_in_a_new_or_empty_folder(tmp_path):
    files = {"b/c.txt": "2\n", "a.txt": "1\n"}
    out = tmp_path / "new" / "out"
    assert render_folder.write_tree(files, out) == [out / "b" / "c.txt", out / "a.txt"]
    assert tree(out) == {**files, render_folder.RECORD: record_of(files)}
    assert (out / render_folder.RECORD).read_text().splitlines()[0] == "# grpo-deploy render record, format 1"
    assert render_folder.read_record(out) == digests(files)
    assert oct((out / "a.txt").stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # like open(): the umask applies
    empty = tmp_path / "empty"
    empty.mkdir()
    render_folder.write_tree(files, empty)
    assert tree(empty) == tree(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "new"]  # no temporary file left anywhere
    assert not [p for p in tmp_path.rglob("*.tmp")]


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def test_rerender_removes_only_listed_stale_files_in_place_and_keeps_everything_else(tmp_path):
    out = tmp_path / "out"
    render_folder.write_tree({"config/a": "1", "hosts/x.env": "x", "hosts/y.env": "y", "top": "t", "deep/er/f": "f"},
                             out)
    config_inode = (out / "config").stat().st_ino
    (out / "hosts" / "mine.txt").write_text("the user's")  # added by the user: kept
    (out / "notes").mkdir()  # the user's empty folder: kept
    (out / "hosts" / "y.env").write_text("edited by the user")  # listed but changed since: kept, no longer listed
    (out / "top").chmod(0o600)
    written = render_folder.write_tree({"config/a": "2", "top": "t2"}, out)
    assert written == [out / "config" / "a", out / "top"]
    assert tree(out) == {"config/a": "2", "hosts/mine.txt": "the user's", "hosts/y.env": "edited by the user",
                         "top": "t2", render_folder.RECORD: record_of({"config/a": "2", "top": "t2"})}
    assert (out / "notes").is_dir() and not (out / "deep").exists()  # emptied by the removal: gone; the user's stays
    assert (out / "config").stat().st_ino == config_inode  # written in place: a bind mount keeps seeing it
    assert (out / "top").stat().st_mode & 0o777 == 0o600  # a rewritten file keeps its mode


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_foreign_folder_is_refused_even_with_a_manifest(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    if kind == "file":
        (out / "MANIFEST").write_text("abc  mine.txt\n")
    else:
        (out / "MANIFEST").mkdir()
    before = tree(out)
    with pytest.raises(render_folder.WriteRefused, match="is not empty and holds no earlier grpo-deploy render"):
        render_folder.write_tree({"mine.txt": "x", "a": "1"}, out)
    assert tree(out) == before and (out / "MANIFEST").exists()


@pytest.mark.parametrize("record", ["# some other tool\n", "link", "folder"])
def test_a_record_that_is_not_this_kits_is_refused(tmp_path, record):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text(render_folder.RECORD_HEADER + "\n")
    if record == "link":
        (out / render_folder.RECORD).symlink_to(target)  # a link, even to a valid record, is not a record
    elif record == "folder":
        (out / render_folder.RECORD).mkdir()
    else:
        (out / render_folder.RECORD).write_text(record)
    with pytest.raises(render_folder.WriteRefused, match="is not a grpo-deploy render record"):
        render_folder.write_tree({"a": "1"}, out, adopt=True)
    assert not (out / "a").exists() and target.read_text() == render_folder.RECORD_HEADER + "\n"
    if record == "folder":
        (out / render_folder.RECORD).rmdir()
    else:
        (out / render_folder.RECORD).unlink()
    (out / render_folder.RECORD).write_text("# grpo-deploy render record, format 9\n")
    with pytest.raises(render_folder.WriteRefused, match="another version of grpo-deploy"):
        render_folder.write_tree({"a": "1"}, out)


@pytest.mark.parametrize("line", ["abc  a", "0" * 64 + "  ../outside", "0" * 64 + "  /etc/passwd", "0" * 64 + " a"])
def test_a_damaged_or_hostile_record_is_refused(tmp_path, line):
    out = tmp_path / "out"
    render_folder.write_tree({"a": "1"}, out)
    (tmp_path / "outside").write_text("not the kit's")
    (out / render_folder.RECORD).write_text(f"{render_folder.RECORD_HEADER}\n{line}\n")
    with pytest.raises(render_folder.WriteRefused, match="line 2 is not '<sha256>  <relative path>'"):
        render_folder.write_tree({"b": "2"}, out)
    assert (tmp_path / "outside").read_text() == "not the kit's" and tree(out)["a"] == "1" and "b" not in tree(out)


def test_links_are_never_written_through_nor_removed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a").write_text("pointee")
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    with pytest.raises(render_folder.WriteRefused,
                       match="is a symbolic link; grpo-deploy does not write through links"):
        render_folder.write_tree({"a": "1"}, link)
    out = tmp_path / "out"
    render_folder.write_tree({"a": "1", "sub/b": "2", "sub/c": "3", "d": "4"}, out)
    (out / "a").unlink()
    (out / "a").symlink_to(elsewhere / "a")  # a render file replaced by a link
    with pytest.raises(render_folder.WriteRefused, match="a symbolic link where the render writes a file"):
        render_folder.write_tree({"a": "1", "sub/b": "2"}, out)
    (out / "a").unlink()
    (out / "a").write_text("1")
    shutil.rmtree(out / "sub")
    (out / "sub").symlink_to(elsewhere)  # a folder of the render replaced by a link
    with pytest.raises(render_folder.WriteRefused, match="a symbolic link where the render needs a folder"):
        render_folder.write_tree({"a": "1", "sub/b": "2"}, out)
    (out / "d").unlink()
    (out / "d").symlink_to(elsewhere / "a")  # a stale listed file replaced by a link: left alone, pointee too
    render_folder.write_tree({"a": "1"}, out)
    assert (out / "d").is_symlink() and (out / "sub").is_symlink()
    assert tree(elsewhere) == {"a": "pointee"}


def test_an_unlisted_file_in_the_way_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    render_folder.write_tree({"a": "1"}, out)
    (out / "b").write_text("the user's b")
    before = tree(out)
    with pytest.raises(render_folder.WriteRefused,
                       match=r"out/b exists and is not a file this kit wrote \(the earlier"):
        render_folder.write_tree({"a": "2", "new/c": "3", "b": "2"}, out)
    assert tree(out) == before and not (out / "new").exists()  # nothing half-written
    (out / "b").unlink()
    (out / "b").mkdir()
    with pytest.raises(render_folder.WriteRefused, match="is not a regular file"):
        render_folder.write_tree({"b": "2"}, out)
    (out / "b").rmdir()
    (out / "b").write_text("a file")
    with pytest.raises(render_folder.WriteRefused, match="is a file where the render needs a folder"):
        render_folder.write_tree({"a": "1", "b/c": "2"}, out)
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(render_folder.WriteRefused, match="exists and is not a directory"):
        render_folder.write_tree({"a": "1"}, file)
    assert file.read_text() == "x"
    with pytest.raises(ValueError, match="not a relative path"):
        render_folder.write_tree({"../a": "1"}, out)


def test_adopt_takes_over_equal_files_of_a_folder_without_record_only(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "compose.yaml").write_text("not rendered")  # not in the render: untouched, not listed
    (out / "a").write_text("1")
    (out / "b").write_text("old")
    with pytest.raises(render_folder.WriteRefused,
                       match="b exists and is not a file this kit wrote \\(its content differs"):
        render_folder.write_tree({"a": "1", "b": "new"}, out, adopt=True)
    assert not (out / render_folder.RECORD).exists()
    render_folder.write_tree({"a": "1", "b": "old"}, out, adopt=True)
    assert tree(out) == {"a": "1", "b": "old", "compose.yaml": "not rendered", render_folder.RECORD: record_of(
        {"a": "1", "b": "old"})}
    render_folder.write_tree({"a": "1", "b": "new"}, out, adopt=True)  # now listed: rewritten
    render_folder.write_tree({"a": "1"}, out, adopt=True)
    assert sorted(tree(out)) == [render_folder.RECORD, "a", "compose.yaml"]


def test_diff_tree_names_missing_differing_and_extra_files(tmp_path):
    files = {"a": "1", "d/b": "2", "c": "3"}
    render_folder.write_tree(files, tmp_path)
    assert render_folder.diff_tree(files, tmp_path) == []  # the record is neither a render file nor extra
    (tmp_path / "d" / "b").write_text("changed")
    (tmp_path / "c").unlink()
    (tmp_path / "d" / "extra").write_text("")
    assert render_folder.diff_tree(files, tmp_path) == ["missing  c", "differs  d/b", "extra    d/extra"]
    assert render_folder.diff_tree(files, tmp_path / "absent") == ["missing  a", "missing  c", "missing  d/b"]


def test_run_render_folder_loses_files_of_an_earlier_render_only(tmp_path, monkeypatch):
    """The deployer's render into this machine's run folder (LocalHost.put_tree) is written as `render -o` writes."""
    from grpo_deploy.deploy import lifecycle as deploy
    from grpo_deploy.deploy.deployment import Deployment
    from grpo_deploy.hosts.connect import HostError, SshOptions

    monkeypatch.chdir(tmp_path)
    dep = Deployment(resolve.resolve(new_spec.embedded_default()), SshOptions())
    state = dep.state

    def write_render(_state):
        deploy.put_render(dep, {})

    write_render(state)
    config_inode = (state.render_dir / "config").stat().st_ino
    rendered = render.render_files(state.res, config_dir=str(state.render_dir / "config"))
    files = {rel: text for rel, text in rendered.items()
             if rel.startswith(("config/", "hosts/local."))}  # what a host's folder holds: config/ and its own files
    assert render_folder.diff_tree(files, state.render_dir) == []
    stale = state.render_dir / "hosts" / "gone.env"  # a file an earlier spec rendered: listed in the record
    stale.write_text("from an earlier spec\n")
    record = state.render_dir / render_folder.RECORD
    record.write_text(record_of({**files, "hosts/gone.env": "from an earlier spec\n"}))
    mine = state.render_dir / "config" / "mine.txt"
    mine.write_text("the user's\n")
    write_render(state)
    assert not stale.exists() and mine.exists()
    assert (state.render_dir / "config").stat().st_ino == config_inode
    (state.render_dir / "hosts" / "local.env").unlink()
    (state.render_dir / "hosts" / "local.env").symlink_to(mine)
    with pytest.raises(HostError, match="cannot write the run's render: .*is a symbolic link where the render writes"):
        write_render(state)
    assert mine.read_text() == "the user's\n"
