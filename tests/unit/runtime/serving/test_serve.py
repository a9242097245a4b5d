"""Server launcher: argument file parsing, umask, and the exec'd command."""

import os
import sys

from grpo_deploy.runtime.serving import serve


def test_one_argument_per_line_taken_literally():
    text = (
        '# comment\n\n--model\n /models/tiny \n--weight-transfer-config\n{"backend": "nccl"}\n'
        "  # indented\n--enable-lora\n"
    )
    assert serve.parse_args_file(text) == [
        "--model",
        "/models/tiny",
        "--weight-transfer-config",
        '{"backend": "nccl"}',
        "--enable-lora",
    ]


def test_main_execs_the_api_server_with_umask(tmp_path, monkeypatch):
    args_file = tmp_path / "server.args"
    args_file.write_text("--model\n/m\n--port\n8000\n")
    monkeypatch.setenv("GRPO_UMASK", "0027")
    calls = []
    previous = os.umask(0o022)
    try:
        assert serve.main(["--args-file", str(args_file)], execvp=lambda f, argv: calls.append((f, argv))) == 0
        current = os.umask(0o022)
    finally:
        os.umask(previous)
    assert current == 0o027
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port", "8000"]
    assert calls == [(sys.executable, command)]


def test_missing_args_file(tmp_path, capsys):
    assert serve.main(["--args-file", str(tmp_path / "none")]) == 2
    assert "cannot read --args-file" in capsys.readouterr().err


def test_leading_model_path_becomes_model_flag():
    assert serve.server_command(["/models/tiny", "--port", "8000"], python="py") == [
        "py",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/tiny",
        "--port",
        "8000",
    ]
    assert serve.server_command(["--model", "/m"], python="py")[3:] == ["--model", "/m"]
