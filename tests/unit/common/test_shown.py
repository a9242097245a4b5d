"""Tests of grpo_deploy.common.shown: a value in a message is one short printable line, a credential never shown; text
a container wrote is printed without control characters or terminal escapes (printable)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_deploy.common import shown as s

BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def test_short_values_are_shown_whole_and_long_ones_by_a_prefix():
    assert s.shown("abc") == "'abc'" and s.shown(None) == "None" and s.shown(3) == "3"
    long = "x" * 100
    assert s.shown(long) == "'xxxxxxxxxxxx...' (100 characters)"
    assert s.shown({"a": 1}) == "a mapping of 1 key(s)" and s.shown([1, 2]) == "a list of 2 item(s)"


def test_unprintable_characters_are_escaped_onto_one_line():
    out = s.shown("a\nb\u202ec'")
    assert "\n" not in out and "\u202e" not in out and out == "'a\\u000ab\\u202ec\\''"
    assert s.shown_key("a\nb") == repr("a\nb") and s.shown_key("plain") == "plain"
    assert s.shown_key("k" * 65) == "<a key of 65 characters>"


def test_credentials_and_hashes_are_never_shown():
    for secret in ("hf_abcdefghijklmnopqrst", "ghp_0123456789abcdef", "AbCdEf0123456789XyZw99",
                   "$6$salt$hashhashhash", "d41d8cd98f00b204e9800998ecf8427e"):
        assert s.looks_secret(secret), secret
        assert secret not in s.shown(secret) and "credential" in s.shown(secret)
    assert not s.looks_secret("/shared/runs/my-run/checkpoints") and not s.looks_secret("Qwen/Qwen2.5-Math-1.5B")


def test_did_you_mean_offers_the_closest_known_name():
    assert s.did_you_mean("sead", ["seed", "name"]) == "; did you mean 'seed'?"
    assert s.did_you_mean("zzz", ["seed"]) == ""


def test_printable_removes_escape_sequences_whole_and_every_control_but_newline_and_tab():
    cases = {
        "a\x1b]0;title\x07b": "ab",  # OSC: a window title, ended by BEL
        "a\x1b]8;;http://x.example/\x1b\\link\x1b]8;;\x1b\\b": "alinkb",  # OSC 8: a hyperlink, ended by ST
        "x\x1b[2Jy\x1b[1;31mz": "xyz",  # CSI: a screen clear, a colour
        "\x9b31mred": "red",  # 8-bit CSI
        "a\x1bP+q544e\x1b\\b": "ab",  # DCS: a terminal query
        "a\x1b(Bb\x1b7c": "abc",  # other escapes: a charset, save cursor
        "a\x1b]0;no end\nnext": "a\nnext",  # an unterminated string ends at the line
        "tab\tand\nnewline\r\x00\x07\x7f\x85": "tab\tand\nnewline",
        "over\u202eride\u2066iso\u2069late\u202a": "overrideisolate",
        "tail\x1b": "tail",
        "plain ünïcödé text": "plain ünïcödé text",
    }
    for text, want in cases.items():
        assert s.printable(text) == want, (text, s.printable(text))
    assert s.printable(3.5) == "3.5"


@given(st.text(alphabet=st.characters(max_codepoint=0x2070)))
@settings(max_examples=300, deadline=None)
def test_printable_leaves_no_control_and_is_its_own_fixed_point(text):
    out = s.printable(text)
    assert not any(ord(c) < 0x20 and c not in "\n\t" or 0x7f <= ord(c) <= 0x9f or c in BIDI for c in out)
    assert s.printable(out) == out
