"""Injection through every free-text field into every rendered format: a value that would start a line of its own
(newline, CR, Unicode line separator, NUL) or be expanded (`$`) is refused with the key named, and nothing is
rendered; values that are odd but safe render as exactly one line. Secrets from the environment never reach an
output file or the error stream."""

from __future__ import annotations

import json

import pytest

from tests.hostile.helpers import (
    PAYLOADS,
    assert_refused,
    changed,
    cli,
    preflight_problems,
    render,
    rendered_files,
    write_spec,
)

# (base, key path, a valid value) for every free-text field of the spec and of the overrides that reach a file.
FIELDS = [
    ("gb10-pair", ("model", "path"), "Qwen/Qwen2.5-Math-1.5B"),
    ("gb10-pair", ("model", "path"), "/models/qwen"),
    ("gb10-pair", ("model", "served_name"), "policy"),
    ("gb10-pair", ("model", "served_name"), "Qwen/Qwen2.5-Math-1.5B"),
    ("gb10-pair", ("storage", "volume"), "grpo-deploy-shared"),
    ("gb10-pair", ("storage", "mount"), "/shared"),
    ("gb10-pair", ("storage", "nfs", "server"), "spark1"),
    ("gb10-pair", ("storage", "nfs", "export"), "/srv/grpo-deploy"),
    ("gb10-pair", ("storage", "nfs", "options"), "nfsvers=4.1,hard"),
    ("gb10-pair", ("hosts", 0, "address"), "spark1"),
    ("gb10-pair", ("hosts", 0, "name"), "spark1"),
    ("gb10-pair", ("hosts", 0, "shared_dir"), "/data/share"),
    ("gb10-pair", ("hosts", 0, "mount"), "/shared"),
    ("gb10-pair", ("images", "server"), "grpo-deploy/server:gb10"),
    ("gb10-pair", ("images", "trainer"), "grpo-deploy/trainer:gb10"),
    ("a100-verl", ("images", "verl"), "grpo-deploy/verl:a100"),
    ("gb10-pair", ("logger", "project"), "grpo"),
    ("gb10-pair", ("logger", "entity"), "team"),
    ("gb10-pair", ("run", "name"), "exp1"),
    ("a100-verl", ("run", "name"), "exp1"),
    ("gb10-pair", ("checkpoints", "dir"), "/shared/ck"),
    ("gb10-pair", ("checkpoints", "resume"), "/shared/ck/checkpoint-50"),
    ("a100-verl", ("checkpoints", "dir"), "/shared/ck"),
    ("gb10-pair", ("dataset", "path"), "/shared/data/train.jsonl"),
    ("gb10-pair", ("overrides", "vllm", "env", "EXTRA_VAR"), "1"),
    ("gb10-pair", ("overrides", "trl", "run_name"), "exp1"),
    ("a100-verl", ("overrides", "verl", "trainer.project_name"), "proj"),
    ("a100-verl", ("overrides", "verl", "data.train_files"), "/shared/data/train.parquet"),
]
BREAKS = ["\n", "\r", "\r\n", "\u2028", "\u2029", "\x85", "\x00", "\x0b", "\x1b"]


def _key(path: tuple) -> str:
    from grpo_deploy.spec import key_str

    return key_str(path)


def _ids(v):
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


@pytest.mark.parametrize(("base", "path", "valid"), FIELDS, ids=_ids)
def test_newline_in_a_field_is_refused_by_key(tmp_path, base, path, valid):
    """A newline in model.path must not create a COMPOSE_FILE= line, a --trust-remote-code line or HF_TOKEN=: the
    spec is refused, naming the key, and nothing is rendered."""
    for payload in ("COMPOSE_FILE=evil", "--trust-remote-code", "HF_TOKEN=stolen"):
        run, out = render(tmp_path, changed(base, {path: f"{valid}\n{payload}"}))
        assert_refused(run, key=_key(path))
        assert not out.exists()


@pytest.mark.parametrize(("base", "path", "valid"), FIELDS[::4], ids=_ids)
def test_every_line_break_is_refused(tmp_path, base, path, valid):
    """Not only \\n: Python's str.splitlines() (the kit's own readers) also splits at \\r, \\x85, \\u2028 ..."""
    for brk in BREAKS:
        run, out = render(tmp_path, changed(base, {path: f"{valid}{brk}INJECTED=1"}))
        assert_refused(run, key=_key(path))
        assert not out.exists()


@pytest.mark.parametrize(("base", "path", "valid"), FIELDS[::2], ids=_ids)
def test_trailing_newline_is_refused(tmp_path, base, path, valid):
    """A regex anchored with `$` matches before a final newline: the types use fullmatch."""
    run, out = render(tmp_path, changed(base, {path: valid + "\n"}))
    assert_refused(run, key=_key(path))
    assert not out.exists()


def test_valid_values_of_the_fields_render(tmp_path):
    """The control: every valid value above renders (so the refusals are about the injection)."""
    for i, (base, path, valid) in enumerate(FIELDS):
        work = tmp_path / str(i)
        work.mkdir()
        extra = {("model", "served_name"): "policy"} if valid.startswith("/models") else {}
        if path[0] == "logger":  # a project or entity only a W&B logger reads (alone it is refused as ignored)
            extra[("logger", "kind")] = "wandb"
        run, out = render(work, changed(base, {path: valid, **extra}))
        assert run.code == 0, (path, run.err)
        text = "\n".join(rendered_files(out).values())
        assert not any(line.startswith(PAYLOADS) for line in text.splitlines())


@pytest.mark.parametrize("name", ["EXTRA\nVAR", "EXTRA_VAR\n", "A B", "a-b", "1A", "HF_TOKEN", "MY_SECRET", "X=Y",
                                  "COMPOSE_FILE=evil\nX"])
def test_vllm_env_names_are_refused(tmp_path, name):
    run, out = render(tmp_path, changed("cpu", {("overrides", "vllm", "env"): {name: "1"}}))
    assert_refused(run, words=("overrides.vllm.env.",))
    assert any("environment variable name" in p or "credential" in p for p in run.problems), run.err
    assert not out.exists()


@pytest.mark.parametrize("value", ["${WANDB_API_KEY}", "$HOME", "a$b", "x#comment", "'quoted'", '"quoted"', "a`id`",
                                   "back\\slash"])
def test_vllm_env_values_that_compose_would_expand_are_refused(tmp_path, value):
    run, out = render(tmp_path, changed("cpu", {("overrides", "vllm", "env", "EXTRA_VAR"): value}))
    assert_refused(run, key="overrides.vllm.env.EXTRA_VAR", words=("contains",))
    assert not out.exists()


def test_vllm_env_value_with_spaces_renders_as_one_line(tmp_path):
    run, out = render(tmp_path, changed("cpu", {("overrides", "vllm", "env", "EXTRA_VAR"): "a b:c,d"}))
    assert run.code == 0, run.err
    lines = rendered_files(out)["config/server.env"].splitlines()
    assert [line for line in lines if line.startswith("EXTRA_VAR")] == ["EXTRA_VAR=a b:c,d"]


@pytest.mark.parametrize("arg", ["--max-log-len=5\n--trust-remote-code", "--max-log-len=5\u2028--trust-remote-code",
                                 "--max-log-len=5\r--port=9", "x\x00"])
def test_vllm_extra_args_cannot_hide_a_second_argument(tmp_path, arg):
    run, out = render(tmp_path, changed("cpu", {("overrides", "vllm", "extra_args"): [arg]}))
    assert_refused(run, key="overrides.vllm.extra_args[0]", words=("control character",))
    assert not out.exists()


def test_vllm_extra_args_one_line_per_item(tmp_path):
    """extra_args is the place for a flag the kit does not own: one line per item, as given."""
    run, out = render(tmp_path, changed("cpu", {("overrides", "vllm", "extra_args"): ["--trust-remote-code",
                                                                                        "--max-log-len", "5"]}))
    assert run.code == 0, run.err
    args = [line for line in rendered_files(out)["config/server.args"].splitlines() if line]
    assert args[-3:] == ["--trust-remote-code", "--max-log-len", "5"]
    assert args.count("--trust-remote-code") == 1


@pytest.mark.parametrize("path", [("model", "path"), ("model", "served_name"), ("hosts", 0, "address")])
def test_trust_remote_code_smuggled_through_another_field(tmp_path, path):
    run, out = render(tmp_path, changed("gb10-pair", {path: "spark1\n--trust-remote-code"}))
    assert_refused(run, key=_key(path))
    assert not out.exists()


# ------------------------------------------------------------------ secrets

SECRET = "hf_secret_value_123"


@pytest.mark.parametrize(("path", "value"), [
    (("logger", "project"), SECRET),
    (("model", "served_name"), SECRET),
    (("model", "path"), f"org/{SECRET}"),
    (("overrides", "vllm", "env", "EXTRA_VAR"), SECRET),
    (("overrides", "vllm", "extra_args"), [f"--api-key={SECRET}"]),
    (("overrides", "trl", "run_name"), f"run-{SECRET}"),
    (("hosts", 0, "address"), f"{SECRET}.example.com"),
    (("overrides", "vllm", "env"), {SECRET.upper(): "1"}),
])
def test_a_secret_from_the_environment_is_refused_and_never_echoed(tmp_path, monkeypatch, path, value):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    data = changed("gb10-pair", {path: value})
    if path == ("overrides", "vllm", "env"):
        monkeypatch.setenv("HF_TOKEN", SECRET.upper())
    run, out = render(tmp_path, data)
    assert_refused(run, words=("holds the value of $HF_TOKEN",))
    secret = SECRET.upper() if path == ("overrides", "vllm", "env") else SECRET
    assert secret not in run.err and secret not in run.out
    assert not out.exists()
    spec = tmp_path / "spec.yaml"
    for argv in (["plan", "--json", "-f", str(spec)], ["preflight", "--json", "--only", "spec", "-f", str(spec)]):
        other = cli(argv, tmp_path)
        assert other.code == 2 and secret not in other.err + other.out, other.out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_a_secret_is_named_with_its_key(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret_987654")
    run, _ = render(tmp_path, changed("cpu", {("overrides", "vllm", "env", "EXTRA_VAR"): "wandb_secret_987654"}))
    assert_refused(run, key="overrides.vllm.env.EXTRA_VAR", words=("$WANDB_API_KEY",))
    assert "wandb_secret_987654" not in run.err


def test_a_model_path_needs_a_served_name(tmp_path):
    """A path is not a name to serve under: the refusal names model.served_name, the key to set."""
    run, _ = render(tmp_path, changed("gb10-pair", {("model", "path"): "/models/qwen"}))
    assert_refused(run, key="model.served_name", words=("'/models/qwen' is not a model name",))


def test_preflight_json_names_the_key_of_an_injection(tmp_path):
    spec = write_spec(tmp_path, changed("gb10-pair", {("model", "path"): "Qwen/x\nCOMPOSE_FILE=evil"}))
    problems = preflight_problems(cli(["preflight", "--json", "--only", "spec", "-f", str(spec)], tmp_path))
    assert len(problems) == 1 and ": model.path: " in problems[0] and "control character" in problems[0]
    assert json.dumps(problems).count("\n") == 0
