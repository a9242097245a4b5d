"""The replica proxy's command line (runtime/serving/proxy_args.py): bad and hostile values (a newline, non-ASCII
digits, a leading '-', credentials, huge numbers, an adapter folder that is relative or not normalised) refused in
one line with exit 2, arguments from a bounded file never read through a link, and good arguments as the proxy's
settings."""

from __future__ import annotations

import pytest

from grpo_deploy.runtime.serving import proxy as rp
from grpo_deploy.runtime.serving.proxy_args import parse_args, settings_of

ADAPTERS = ["--adapter-dir", "/shared/ck/.vllm_lora"]


@pytest.mark.parametrize(
    "argv, says",
    [
        ([], "--replica"),
        (["--replica", "ftp://a:1"], "not an http"),
        (["--replica", "http://user:secret@a:1"], "credentials"),
        (["--replica", "http://a:1/v1"], "base URL"),
        (["--replica", "http://a:99999"], "--replica"),
        (["--replica", "http://a:1", "--replica", "http://a:1"], "twice"),
        (["--replica", "http://a:1", "--listen", "8000"], "HOST:PORT"),
        (["--replica", "http://a:1", "--block-size", "0"], "at least 1"),
        (["--replica", "http://a:1", "--imbalance", "x"], "not a number"),
        (["--replica", "http://a:1", "--load-retry-s", "nan"], "finite"),
        (["--replica", "http://a:1", "--load-retry-s", "inf"], "finite"),
        # hostile values: a newline, non-ASCII digits (int() takes them), a leading '-', a space, '$'
        (["--replica", "http://a:1", "--listen", "a\nb:1"], "HOST:PORT"),
        (["--replica", "http://a:1", "--listen", "127.0.0.1:\uff18\uff10"], "HOST:PORT"),
        (["--replica", "http://a:1", "--listen=-x:80"], "HOST:PORT"),
        (["--replica", "http://a:1", "--listen", "$HOST:80"], "HOST:PORT"),
        (["--replica", "http://a:\uff18\uff10"], "printable ASCII"),
        (["--replica", "http://a b:1"], "printable ASCII"),
        (["--replica", "http://a$b:1"], "not a name or an IP address"),
        (["--replica", "http://a:1", "--block-size", "\uff18"], "not a number"),
        (["--replica", "http://a:1", "--imbalance", "1" + "0" * 22], "at most"),
        (["--replica", "http://a:1", "--load-retry-s", "1e300"], "at most"),
        # the adapter folder: required, absolute, normalised, not /
        (["--replica", "http://a:1", "--adapter-dir", "shared/.vllm_lora"], "absolute, normalised"),
        (["--replica", "http://a:1", "--adapter-dir", "/shared/../etc"], "absolute, normalised"),
        (["--replica", "http://a:1", "--adapter-dir", "//shared/x"], "absolute, normalised"),
        (["--replica", "http://a:1", "--adapter-dir", "/shared/x/"], "absolute, normalised"),
        (["--replica", "http://a:1", "--adapter-dir", "/"], "absolute, normalised"),
        (["--replica", "http://a:1", "--adapter-dir", "/a b"], "printable ASCII"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        rp.main(argv if not argv or "--adapter-dir" in argv else [*argv, *ADAPTERS])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err and "secret" not in err


def test_the_adapter_folder_is_required(capsys):
    with pytest.raises(SystemExit) as stop:
        rp.main(["--replica", "http://a:1"])
    assert stop.value.code == 2 and "--adapter-dir" in capsys.readouterr().err


def test_arguments_come_from_a_file_bounded_and_never_through_a_link(tmp_path, capsys):
    args = tmp_path / "proxy.args"
    args.write_text("# the kit's render\n--listen\n0.0.0.0:8000\n\n--replica\nhttp://server:8000\n")
    parsed = parse_args([f"@{args}", "--replica", "http://server-2:8000", *ADAPTERS])
    assert parsed.listen == ("0.0.0.0", 8000) and parsed.replica == ["http://server:8000", "http://server-2:8000"]
    link = tmp_path / "link.args"
    link.symlink_to(args)
    huge = tmp_path / "huge.args"
    huge.write_text("--replica\n" * 20_000)
    secret = tmp_path / "shadow"
    secret.write_text("root:$y$j9T$planted-hash-value:19000:0:99999:7:::\n")
    for bad, says in ((link, "symbolic link"), (huge, "at most 65536 bytes"), (tmp_path / "none", "no such file"),
                      (secret, "not an arguments file")):
        with pytest.raises(SystemExit) as stop:
            parse_args([f"@{bad}"])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and says in err and err.count("\n") == 1 and "planted" not in err, err


def test_good_arguments_become_settings():
    args = parse_args(
        [
            "--listen",
            "[::1]:9000",
            "--replica",
            "http://a:1/",
            "--replica",
            "https://b:2",
            "--block-size",
            "32",
            "--imbalance",
            "0",
            "--load-retry-s",
            "5",
            *ADAPTERS,
        ]
    )
    assert args.listen == ("::1", 9000) and args.replica == ["http://a:1", "https://b:2"]
    settings = settings_of(args)
    assert (settings.block_size, settings.imbalance, settings.load_retry_s) == (32, 0, 5.0)
    assert settings.adapter_dir == "/shared/ck/.vllm_lora"


def test_the_token_comes_from_the_environment_only_and_require_token_needs_it(monkeypatch, capsys):
    from grpo_deploy.runtime import run_token

    argv = ["--replica", "http://a:1", *ADAPTERS, "--require-token"]
    monkeypatch.delenv(run_token.ENV, raising=False)
    with pytest.raises(SystemExit) as stop:
        rp.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and run_token.ENV in err and err.count("\n") == 1
    bad = "not a token; " * 4
    monkeypatch.setenv(run_token.ENV, bad)
    with pytest.raises(SystemExit) as stop:
        rp.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "not a token of the kit" in err and bad.strip() not in err
    token = run_token.make()
    monkeypatch.setenv(run_token.ENV, token)
    settings = settings_of(parse_args(argv))
    assert settings.token == token and token not in repr(settings)
