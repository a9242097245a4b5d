"""Tests of grpo_deploy.common.shown: a value in a message is one short printable line, a credential never shown."""

from __future__ import annotations

from grpo_deploy.common import shown as s


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
