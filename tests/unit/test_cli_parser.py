"""Tests of grpo_deploy.cli_parser: the grammar names every verb that has a handler, and the shared value parsers
(--hosts, --free-space sizes, -o, counts) take a good value and refuse a hostile one."""

from __future__ import annotations

import pytest

from grpo_deploy import cli_parser
from grpo_deploy.cli import VERBS
from grpo_deploy.cli_parser import build_parser, host_list


def test_every_verb_of_the_grammar_has_a_handler_and_every_handler_a_verb():
    used = set()

    class Recording(dict):
        def __getitem__(self, key):
            used.add(key)
            return super().__getitem__(key)

    build_parser(Recording(VERBS))  # a verb without a handler is a KeyError here
    assert used == set(VERBS)


def test_host_list_drops_blanks():
    assert host_list(" spark1, ,spark2 ") == ["spark1", "spark2"]
    assert host_list(None) == [] and host_list("") == []


def test_parse_size_reads_decimal_and_binary_units():
    assert cli_parser.parse_size("500GB") == 500 * 10**9 and cli_parser.parse_size("1.5 TB") == 15 * 10**11
    assert cli_parser.parse_size("800GiB") == 800 * 2**30 and cli_parser.parse_size("42") == 42
    for bad in ("lots", "-5GB", "5 PB", "1e3", "5GB\n6", "9" * 30):
        with pytest.raises(cli_parser.CliError) as exc:
            cli_parser.parse_size(bad)
        assert "--free-space" in str(exc.value)


@pytest.mark.parametrize("argv", [["render", "-o", ""], ["render", "-o", "a\x00b"], ["render", "-o", "x" * 256],
                                  ["status", "--watch", "0"], ["status", "--watch", "nan"],
                                  ["logs", "--tail", "-1"], ["checkpoints", "prune", "--keep", "0"]])
def test_a_hostile_flag_value_is_refused_by_the_grammar_with_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser(VERBS).parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == cli_parser.EXIT_USAGE and "Traceback" not in err
    assert f"argument {argv[-2]}" in err and " is not a" in err and "required" not in err, err


def test_logs_strips_escapes_unless_raw():
    parser = build_parser(VERBS)
    assert parser.parse_args(["logs"]).raw is False and parser.parse_args(["logs", "--raw"]).raw is True
