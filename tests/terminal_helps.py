"""Test helper run inside a terminal (tests/static/test_terminal.py starts it in a tmux pane): `grpo-deploy --help`
and the help of every verb and sub-verb the parser has, printed to the terminal through cli.main as a user's
`grpo-deploy VERB --help` would print it, and recorded in a JSON file (what argparse wrote, whether stdout was a
terminal and how wide) for the test to compare with what the terminal shows.

Usage: python3 -m tests.terminal_helps RECORD.json"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
from collections.abc import Iterator

from grpo_deploy.cli import VERBS, main
from grpo_deploy.cli_parser import build_parser

MARK = "=== help of:"  # a line before each help, so that the test can split the capture


def verb_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command line that has a help of its own: (), ("init",), ..., ("k8s", "render"), from the parser."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from verb_paths(sub, (*path, name))


def help_text(path: tuple[str, ...]) -> str:
    """What `grpo-deploy PATH --help` writes to stdout (argparse reads the width from the terminal)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*path, "--help"])
    return out.getvalue()


def run(record: str) -> None:
    helps = []
    for path in verb_paths(build_parser(VERBS)):
        text = help_text(path)
        print(f"{MARK} {' '.join(path) or '-'}", flush=True)
        sys.stdout.write(text)
        sys.stdout.flush()
        helps.append({"path": list(path), "text": text})
    with open(record, "w") as f:
        json.dump({"isatty": sys.stdout.isatty(), "columns": shutil.get_terminal_size((0, 0)).columns,
                   "helps": helps}, f)


if __name__ == "__main__":
    run(sys.argv[1])
