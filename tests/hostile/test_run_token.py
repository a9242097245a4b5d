"""The run's token against hostile input (runtime/run_token.py): any Authorization header values — any
characters, lone surrogates, any count — are compared without raising and match only as exactly one `Bearer
<token>`; any environment value is either the kit's token or refused in one line without echoing it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_deploy.runtime import run_token

TOKEN = run_token.make()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=3))
def test_any_header_values_compare_without_raising_and_only_the_exact_one_matches(values):
    assert run_token.matches(values, TOKEN) is (values == [f"Bearer {TOKEN}"])
    assert run_token.matches([*values, f"Bearer {TOKEN}"], TOKEN) is (values == [])


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=400))
def test_any_environment_value_is_the_token_or_one_line_without_it(value):
    try:
        got = run_token.of_environ({run_token.ENV: value})
    except run_token.RunTokenError as error:
        said = str(error)
        # one line, and nothing of the value in it: the message is fixed but for the value's length (a value that
        # happens to be part of the fixed words, e.g. 'TOKE', is not an echo)
        assert said == (f"{run_token.ENV} is set but is not a token of the kit ({len(value.strip())} characters; the "
                        "kit makes 43 of A-Z a-z 0-9 _ -): unset it, or let `grpo-deploy up` pass the run's own")
    else:
        assert got is None or (got == value.strip() and run_token.well_formed(got))
