"""Tests of grpo_deploy.spec.yamlpos: line numbers for keys and items, and refusal of hostile or malformed YAML."""

import os
import subprocess
import sys
import time

import pytest
import yaml

from grpo_deploy.spec.yamlpos import MAX_DEPTH, YamlSyntaxError, load_file, load_text

ALIAS = "YAML anchors and aliases are not supported in a spec; write the value out"


def _bomb(levels: int = 9, refs: int = 9) -> str:
    """Billion laughs: each level is a list of `refs` aliases of the level before (refs**levels strings)."""
    out = ["l0: &l0 lol\n"]
    for i in range(1, levels + 1):
        out.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * refs)}]\n")
    return "".join(out)


def _refused(text: str, source: str = "s.yaml") -> str:
    with pytest.raises(YamlSyntaxError) as info:
        load_text(text, source=source)
    return str(info.value)


def test_lines_of_nested_keys_and_items():
    doc = load_text("a: 1\nb:\n  c: 2\n  d:\n    - x\n    - y: 3\n", source="f.yaml")
    assert doc.line_of(("b", "c")) == 3
    assert doc.line_of(("b", "d", 1)) == 6
    assert doc.line_of(("b", "d", 1, "y")) == 6
    assert doc.where(("b", "missing")) == "f.yaml:2"  # falls back to the nearest known parent


VALID = """\
engine: trl-async
flags: {a: on, b: off, c: yes, d: no, e: ~, f: null}
numbers: [1, 0o17, 2.5, .inf, 1e3, "7", !!int "0x1f"]
when: 2024-05-01
stamp: 2024-05-01 10:00:00
'1': quoted numeric key
"on": quoted bool key
=: value key
blob: !!binary aGk=
tags: !!set {x, y}
ordered: !!omap [{a: 1}, {b: 2}]
text: |
  two
  lines
hosts:
  - name: a
    gpus: {server: [0, 1]}
  - [nested, [list]]
"""


def test_valid_yaml_loads_exactly_as_safe_load():
    doc = load_text(VALID, source="v.yaml")
    assert doc.data == yaml.safe_load(VALID)
    assert doc.data["flags"] == {"a": True, "b": False, "c": True, "d": False, "e": None, "f": None}
    assert doc.data["="] == "value key" and doc.data["on"] == "quoted bool key"


def test_every_key_and_item_has_its_line():
    doc = load_text(VALID, source="v.yaml")
    lines = VALID.splitlines()
    for path in [("engine",), ("flags",), ("flags", "c"), ("numbers", 3), ("text",), ("hosts", 0), ("hosts", 1),
                 ("hosts", 0, "gpus"), ("hosts", 0, "gpus", "server", 1), ("hosts", 1, 1, 0), ("=",), ("1",)]:
        assert path in doc.lines, path
        assert str(path[-1]).strip("'") in lines[doc.lines[path] - 1] or isinstance(path[-1], int)
    assert doc.lines[("hosts", 1)] == 18 and doc.lines[("hosts", 0, "gpus")] == 17


def test_empty_document_is_none():
    assert load_text("# only a comment\n", source="e.yaml").data is None


def test_syntax_error_names_file_and_line():
    assert _refused("a: 1\nb: [1,\n", source="broken.yaml").startswith("broken.yaml:3: not valid YAML: ")
    assert _refused("a: x\n  b: y\n", source="indent.yaml") == \
        "indent.yaml:2: not valid YAML: mapping values are not allowed here"


def test_alias_refused_with_line():
    assert _refused("a: 1\nb: &x 2\nc: *x\n") == f"s.yaml:2: {ALIAS}"  # the anchor, first seen
    assert _refused("a: 1\nb: *x\n") == f"s.yaml:2: {ALIAS}"  # an alias of nothing: still our message


def test_anchor_alone_refused():
    assert _refused("a:\n  b: &unused {c: 1}\n") == f"s.yaml:2: {ALIAS}"


def test_self_referencing_alias_refused():
    assert _refused("x: 1\nloop: &a [1, *a]\n") == f"s.yaml:2: {ALIAS}"
    assert _refused("&a [*a]\n") == f"s.yaml:1: {ALIAS}"


def test_alias_bomb_refused_fast_in_process():
    start = time.monotonic()
    assert _refused(_bomb(), source="bomb.yaml") == f"bomb.yaml:1: {ALIAS}"
    assert time.monotonic() - start < 2


def test_alias_bomb_refused_under_memory_cap(tmp_path):
    """9 levels of 9 references (387 million strings once expanded): refused in time under a 512 MiB cap."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    code = (
        "import resource, sys, time\n"
        "resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))\n"
        "from grpo_deploy.spec.yamlpos import YamlSyntaxError, load_file\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    load_file(sys.argv[1])\n"
        "except YamlSyntaxError as exc:\n"
        "    print(f'{time.monotonic() - start:.4f}')\n"
        "    print(exc)\n"
        "else:\n"
        "    print('loaded')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    elapsed, message = proc.stdout.splitlines()
    assert message == f"{bomb}:1: {ALIAS}"
    assert float(elapsed) < 2


def test_duplicate_key_names_both_lines():
    text = "run:\n  seed: 1\n  uid: 1000\n  seed: 2\nother: {seed: 3}\n"
    assert _refused(text) == "s.yaml:4: key 'seed' appears twice in the same mapping (lines 2 and 4); keep one"


def test_duplicate_key_in_flow_mapping():
    assert _refused("a: 1\nb: {x: 1, y: 2, x: 3}\n") == \
        "s.yaml:2: key 'x' appears twice in the same mapping (lines 2 and 2); keep one"


def test_same_key_in_different_mappings_is_fine():
    assert load_text("a: {x: 1}\nb: {x: 2}\nc: [{x: 1}, {x: 2}]\n").data["c"] == [{"x": 1}, {"x": 2}]


@pytest.mark.parametrize(("text", "line", "got"), [
    ("a: 1\n1: x\n", 2, "'1' (read as int)"),
    ("a: 1\nnull: x\n", 2, "'null' (read as null)"),
    ("on: x\n", 1, "'on' (read as bool)"),
    ("a:\n  b:\n    1.5: x\n", 3, "'1.5' (read as float)"),
    ("a: 1\n[a]: b\n", 2, "a list"),
    ("? {a: 1}\n: b\n", 1, "a mapping"),
    ("? \n: b\n", 1, "an empty key (read as null)"),
])
def test_non_string_keys_refused(text, line, got):
    assert _refused(text) == f"s.yaml:{line}: keys must be strings, got {got}; quote it if it is meant as a name"


def test_merge_key_refused():
    assert _refused("a: 1\n<<: {b: 2}\n") == \
        "s.yaml:2: YAML merge keys (<<) are not supported in a spec; write the keys out"


def test_deep_nesting_refused_not_recursion_error():
    assert _refused("a: " + "[" * 10_000 + "]" * 10_000 + "\n") == \
        f"s.yaml:1: nested deeper than {MAX_DEPTH} levels; a spec needs only a few, flatten it"
    block = "".join(" " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5))
    assert _refused(block).startswith(f"s.yaml:{MAX_DEPTH + 1}: nested deeper than {MAX_DEPTH} levels")


def test_nesting_at_the_limit_loads():
    text = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert load_text(text).data == yaml.safe_load(text)


def test_bad_explicit_tag_is_a_yaml_error():
    assert _refused("a: 1\nb: !!int zz\n").startswith("s.yaml:2: not valid YAML: cannot read 'zz' as !!int")
    assert _refused("t: !!timestamp soon\n").startswith("s.yaml:1: not valid YAML: cannot read 'soon' as !!timestamp")
    assert _refused("x: !custom 1\n").startswith("s.yaml:1: not valid YAML: could not determine a constructor")


def test_huge_integer_is_a_yaml_error():
    assert _refused("a: 1" + "0" * 5000 + "\n").startswith("s.yaml:1: not valid YAML: cannot read '1000")


def test_two_documents_refused():
    assert _refused("a: 1\n---\nb: 2\n").startswith("s.yaml:2: not valid YAML:")


def test_text_over_limit_refused():
    assert _refused("a: " + "x" * (1 << 20) + "\n") == f"s.yaml: the spec is {(1 << 20) + 4} bytes; the limit is 1 MiB"


def test_two_mib_file_refused_fast(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" + b"x" * (2 << 20))
    start = time.monotonic()
    with pytest.raises(YamlSyntaxError) as info:
        load_file(big)
    assert time.monotonic() - start < 0.5
    assert str(info.value) == f"{big}: the spec is {(2 << 20) + 5} bytes; the limit is 1 MiB"


def test_file_at_the_limit_loads(tmp_path):
    f = tmp_path / "edge.yaml"
    f.write_bytes(b"a: " + b"x" * ((1 << 20) - 4) + b"\n")
    assert len(load_file(f).data["a"]) == (1 << 20) - 4


def test_missing_file(tmp_path):
    with pytest.raises(YamlSyntaxError) as info:
        load_file(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: no such file; check the path " \
                              "(or write a spec with `grpo-deploy init`)"


def test_directory_path(tmp_path):
    with pytest.raises(YamlSyntaxError) as info:
        load_file(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory, not a spec file; pass the path of the spec's YAML file"


@pytest.mark.parametrize(("data", "message"), [
    (b"a: 1\nb: x\x00y\n", ":2: holds a NUL byte, so it is a binary file, not YAML text; pass the spec's YAML file"),
    (b"a: 1\n\x7fELF\x01\x02\n", ":2: holds the control character 0x7f, which YAML text cannot contain"),
    ("a: 1\nname: café\n".encode("latin-1"), ":2: not UTF-8 text (byte 0xe9 at offset 14); save the spec as UTF-8"),
    ("a: 1\n".encode("utf-16"), ": the file is UTF-16 encoded; save the spec as UTF-8"),
])
def test_not_yaml_text(tmp_path, data, message):
    f = tmp_path / "spec.yaml"
    f.write_bytes(data)
    with pytest.raises(YamlSyntaxError) as info:
        load_file(f)
    assert str(info.value).startswith(f"{f}{message}")


def test_utf8_with_bom_and_non_ascii_loads(tmp_path):
    f = tmp_path / "bom.yaml"
    f.write_bytes(b"\xef\xbb\xbfname: caf\xc3\xa9\nb: 2\n")
    doc = load_file(f)
    assert doc.data == {"name": "café", "b": 2} and doc.lines[("b",)] == 2 and doc.source == str(f)


def test_permission_denied(tmp_path):
    """Read by a user who may not: root reads any file, so a forked child drops to nobody first."""
    f = tmp_path / "secret.yaml"
    f.write_text("a: 1\n")
    f.chmod(0)
    tmp_path.chmod(0o755)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            try:
                load_file(f)
                message = "loaded"
            except YamlSyntaxError as exc:
                message = str(exc)
            os.write(write_fd, message.encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    message = os.read(read_fd, 4096).decode()
    os.waitpid(pid, 0)
    os.close(read_fd)
    assert message.startswith(f"{f}: permission denied reading the file; make it readable"), message


def test_a_device_is_refused_before_any_read():
    """/dev/zero reports no size: it is refused as a device, before a byte is read (the bounded reader)."""
    with pytest.raises(YamlSyntaxError) as info:
        load_file("/dev/zero")
    assert str(info.value).startswith("/dev/zero: is a character device, not a regular file")


@pytest.mark.parametrize(("text", "expected"), [
    (_bomb(), f"bomb.yaml:1: {ALIAS}"),
    ("engine: trl-async\nrun:\n  seed: 1\n  seed: 2\n",
     "bomb.yaml:4: key 'seed' appears twice in the same mapping (lines 3 and 4); keep one"),
])
def test_cli_plan_shows_one_line_and_exits_2(tmp_path, capsys, text, expected):
    from grpo_deploy.cli import main  # imported here: the rest of this file tests yamlpos alone

    bad = tmp_path / "bomb.yaml"
    bad.write_text(text)
    assert main(["plan", "-f", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    matching = [line for line in err.splitlines() if expected.replace("bomb.yaml", str(bad)) in line]
    assert len(matching) == 1, err
