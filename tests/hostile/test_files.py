"""Malformed spec files: each refused with one line naming the file (and the line where there is one), exit 2, for
plan, render and preflight alike; the alias bomb within 2 s."""

from __future__ import annotations

import time

import pytest

from tests.hostile.helpers import assert_refused, cli, preflight_problems


def _bomb(levels: int = 9) -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return ("\n".join(lines) + "\n").encode()


FILES = [
    ("latin1", b"engine: verl\nrun: {name: caf\xe9}\n", ("spec.yaml:2", "not UTF-8")),
    ("nul", b"engine: trl-async\nrun:\x00\n", ("spec.yaml:2", "NUL byte")),
    ("utf16", "engine: verl\n".encode("utf-16"), ("UTF-16",)),
    ("empty", b"", ("<top>", "must be a YAML mapping")),
    ("only-comments", b"# nothing here\n", ("<top>", "must be a YAML mapping")),
    ("list", b"- engine: verl\n- run: {}\n", ("<top>", "must be a YAML mapping")),
    ("scalar", b"hello\n", ("<top>", "must be a YAML mapping")),
    ("duplicate", b"engine: verl\nrun: {}\nengine: trl-async\n",
     ("spec.yaml:3", "key 'engine' appears twice", "lines 1 and 3")),
    ("nested-duplicate", b"engine: trl-async\nrun:\n  seed: 1\n  uid: 1000\n  seed: 2\n",
     ("spec.yaml:5", "key 'seed' appears twice", "lines 3 and 5")),
    ("alias", b"engine: &e verl\nrun: {name: *e}\n", ("anchors and aliases",)),
    ("merge", b"base: {a: 1}\nrun:\n  <<: {name: x}\n", ("spec.yaml:3",)),
    ("python-tag", b"engine: !!python/object/apply:os.system ['id']\n", ("spec.yaml:1",)),
    ("syntax", b"run: [\n", ("not valid YAML",)),
    ("tab-indent", b"run:\n\tname: x\n", ("spec.yaml:2",)),
    ("two-documents", b"engine: verl\n---\nengine: verl\n", ("spec.yaml",)),
    ("deep", b"a: " + b"[" * 200 + b"]" * 200 + b"\n", ("spec.yaml",)),
    ("huge", b"# " + b"x" * (2 << 20) + b"\n", ("1 MiB",)),
]


@pytest.mark.parametrize(("name", "raw", "words"), FILES, ids=[f[0] for f in FILES])
def test_malformed_files_are_one_line_exit_2(tmp_path, name, raw, words):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(raw)
    for argv in (["plan", "-f", str(spec)], ["render", "-f", str(spec), "-o", str(tmp_path / "render")]):
        run = cli(argv, tmp_path)
        assert_refused(run, words=words)
        assert len(run.problems) == 1, run.err
    assert not (tmp_path / "render").exists()
    problems = preflight_problems(cli(["preflight", "--json", "--only", "spec", "-f", str(spec)], tmp_path))
    assert len(problems) == 1 and all(w in problems[0] for w in words), problems


@pytest.mark.parametrize(("make", "words"), [
    (lambda tmp: tmp, ("is a directory",)),
    (lambda tmp: tmp / "missing.yaml", ("no such file",)),
    (lambda tmp: tmp / "spec.yaml" / "x", ("cannot read",)),
    (lambda tmp: "/dev/zero", ("character device", "not a regular file")),
    (lambda tmp: str(tmp / "a\x00b.yaml"), ("NUL byte",)),
    (lambda tmp: str(tmp / "line\nbreak.yaml"), ("'", "no such file")),
])
def test_bad_spec_paths_are_one_line_exit_2(tmp_path, make, words):
    (tmp_path / "spec.yaml").write_text("engine: verl\n")
    run = cli(["plan", "-f", str(make(tmp_path))], tmp_path)
    assert_refused(run, words=words)
    assert len(run.problems) == 1, run.err


def test_alias_bomb_is_refused_within_2_seconds(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(_bomb())  # 9 ** 9 (387 million) leaves if expanded
    start = time.perf_counter()
    run = cli(["plan", "-f", str(spec)], tmp_path)
    elapsed = time.perf_counter() - start
    assert_refused(run, words=("spec.yaml:1", "anchors and aliases are not supported"))
    assert elapsed < 2.0, elapsed
    print(f"alias bomb refused in {elapsed * 1000:.1f} ms")
