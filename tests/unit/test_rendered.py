"""Tests of grpo_deploy.rendered: writing a render to a folder (replace, clean, plain), diffing, reading env files."""

from __future__ import annotations

import pytest

from grpo_deploy import render, rendered, resolve, scaffold, spec


def test_parse_env_round_trips_a_rendered_server_env():
    text = scaffold.spec_text("gb10", "trl-async", []).replace(
        "overrides: {}", "overrides: {vllm: {env: {XFLAGS: 'a=b c', FLAG: true}}}")
    text = render.render_files(resolve.resolve(spec.loads(text)))["config/server.env"]
    env = rendered.parse_env(text)
    assert env["GRPO_ROLE"] == "server" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert env["XFLAGS"] == "a=b c" and env["FLAG"] == "1"  # split on the first '=' only
    kept = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert [f"{k}={v}" for k, v in env.items()] == kept  # every KEY=VALUE line, in order, nothing else
    assert rendered.parse_env("# c\n\nA=1\n") == {"A": "1"}
    with pytest.raises(ValueError, match="line 2"):
        rendered.parse_env("A=1\nnot an assignment\n")


def test_write_tree_replace_swaps_the_folder_and_refuses_a_foreign_one(tmp_path):
    out = tmp_path / "out"
    rendered.write_tree({"MANIFEST": "m\n", "a/b.txt": "1\n", "old.txt": "x"}, out, replace=True)
    written = rendered.write_tree({"MANIFEST": "m\n", "a/b.txt": "2\n"}, out, replace=True)
    assert written == [out / "MANIFEST", out / "a" / "b.txt"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["MANIFEST", "a", "a/b.txt"]
    assert (out / "a" / "b.txt").read_text() == "2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep me")
    with pytest.raises(rendered.NotARenderError, match="not an earlier render"):
        rendered.write_tree({"MANIFEST": "m\n"}, foreign, replace=True)
    assert [p.name for p in foreign.iterdir()] == ["mine.txt"]


def test_write_tree_clean_removes_stale_files_in_place_and_plain_keeps_them(tmp_path):
    out = tmp_path / "out"
    rendered.write_tree({"config/a": "1", "hosts/x.env": "x", "top": "t"}, out)
    config_inode = (out / "config").stat().st_ino
    rendered.write_tree({"config/a": "2", "config/b": "b"}, out)
    assert (out / "top").exists() and (out / "hosts" / "x.env").exists()  # plain: other files stay
    rendered.write_tree({"config/a": "3"}, out, clean=True)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["config", "config/a"]
    assert (out / "config" / "a").read_text() == "3"
    assert (out / "config").stat().st_ino == config_inode  # written in place: a bind mount keeps seeing it


def test_diff_tree_names_missing_differing_and_extra_files(tmp_path):
    files = {"a": "1", "d/b": "2", "c": "3"}
    rendered.write_tree(files, tmp_path)
    assert rendered.diff_tree(files, tmp_path) == []
    (tmp_path / "d" / "b").write_text("changed")
    (tmp_path / "c").unlink()
    (tmp_path / "d" / "extra").write_text("")
    assert rendered.diff_tree(files, tmp_path) == ["missing  c", "differs  d/b", "extra    d/extra"]
    assert rendered.diff_tree(files, tmp_path / "absent") == ["missing  a", "missing  c", "missing  d/b"]


def test_run_render_folder_loses_files_of_an_earlier_render(tmp_path):
    from grpo_deploy.launch import RunState, write_render

    state = RunState(resolve.resolve(scaffold.embedded_default()), root=tmp_path)
    stale = state.render_dir / "hosts" / "gone.env"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier spec\n")
    write_render(state)
    assert not stale.exists()
    files = render.render_files(state.res, config_dir=str(state.render_dir / "config"))
    assert rendered.diff_tree(files, state.render_dir) == []
