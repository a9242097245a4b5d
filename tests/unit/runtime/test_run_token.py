"""The run's token (runtime/run_token.py): made in the kit's form, read from the environment without ever
echoing a bad value, sent as one bearer header, and compared in constant time with only the exact header accepted."""

from __future__ import annotations

import hmac

import pytest

from grpo_deploy.runtime import run_token


def test_a_token_is_new_each_time_and_of_the_kit_s_form():
    a, b = run_token.make(), run_token.make()
    assert a != b and len(a) == 43 and run_token.well_formed(a)


def test_the_environment_gives_the_token_or_none():
    token = run_token.make()
    assert run_token.of_environ({run_token.ENV: token}) == token
    assert run_token.of_environ({}) is None and run_token.of_environ({run_token.ENV: "  "}) is None
    assert run_token.headers(token) == {"Authorization": f"Bearer {token}"}
    assert run_token.headers(None) == {} and run_token.env_headers({}) == {}


@pytest.mark.parametrize("bad", ["short", "x" * 300, "a b" * 20, "tok\nen" * 8, "é" * 40, "Bearer " + "a" * 40])
def test_a_malformed_token_is_refused_in_one_line_without_its_value(bad):
    with pytest.raises(run_token.RunTokenError) as caught:
        run_token.of_environ({run_token.ENV: bad})
    said = str(caught.value)
    assert "\n" not in said and bad.strip() not in said and run_token.ENV in said
    assert run_token.env_headers({run_token.ENV: bad}) == {}  # the front then answers 401


def test_only_exactly_one_bearer_header_with_the_token_matches():
    token = run_token.make()
    assert run_token.matches([f"Bearer {token}"], token)
    for values in ([], [token], [f"bearer {token}"], [f"Bearer {token} "], [f"Bearer {token}x"],
                   [f"Bearer {token[:-1]}"], [f"Basic {token}"], [f"Bearer {token}", f"Bearer {token}"],
                   ["Bearer \udcff" + token[1:]], ["\ud800"], [f"Bearer {run_token.make()}"]):
        assert not run_token.matches(values, token), values


def test_the_compare_is_hmac_compare_digest(monkeypatch):
    seen, real = [], hmac.compare_digest

    def spy(a, b):
        seen.append((type(a), type(b)))
        return real(a, b)

    monkeypatch.setattr(run_token.hmac, "compare_digest", spy)
    token = run_token.make()
    assert run_token.matches([f"Bearer {token}"], token) and not run_token.matches(["Bearer nope"], token)
    assert seen == [(bytes, bytes)] * 2
