"""The run's token: the per-run secret the kit's front (the replica proxy) asks of every request, made once per run by
the deployer (`make`), handed to the roles in their environment as GRPO_RUN_TOKEN from a 0600 file on each host (never
a rendered file, a command line or a log), read back by each process (`of_environ`), sent as `Authorization: Bearer`
(`headers`) and checked in constant time (`matches`). Only the header counts: a token in a query string is not one."""

from __future__ import annotations

import hmac
import os
import re
import secrets

ENV = "GRPO_RUN_TOKEN"
"""The environment variable the token reaches a role's processes in (compose reads it from the run's 0600 env file)."""
NBYTES = 32  # secrets.token_urlsafe(32): 43 characters, 256 bits
_FORM = re.compile(r"[A-Za-z0-9_-]{32,256}")  # what token_urlsafe makes; nothing that could break a header


class RunTokenError(ValueError):
    """The environment holds something that is not a token of the kit (said without the value)."""


def make() -> str:
    """A new token for a run."""
    return secrets.token_urlsafe(NBYTES)


def well_formed(token: str) -> bool:
    return bool(_FORM.fullmatch(token))


def of_environ(environ: dict[str, str] | None = None) -> str | None:
    """The run's token from GRPO_RUN_TOKEN, or None when it is unset or empty; RunTokenError (never echoing the
    value) when it is not one the kit makes."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not value:
        return None
    if not well_formed(value):
        raise RunTokenError(f"{ENV} is set but is not a token of the kit ({len(value)} characters; the kit makes "
                            "43 of A-Z a-z 0-9 _ -): unset it, or let `grpo-deploy up` pass the run's own")
    return value


def headers(token: str | None) -> dict[str, str]:
    """The header that carries *token* ({} without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def env_headers(environ: dict[str, str] | None = None) -> dict[str, str]:
    """headers() of the token in this process's environment; {} when there is none or it is not well formed (the
    front then answers 401, which says what is missing)."""
    try:
        return headers(of_environ(environ))
    except RunTokenError:
        return {}


def matches(values: list[str], token: str) -> bool:
    """Whether the request's Authorization header values (*values*: all of them) are exactly one `Bearer <token>`,
    compared in constant time (hmac.compare_digest over bytes; any length or character may come in)."""
    if len(values) != 1:
        return False
    given = values[0].encode("utf-8", "surrogatepass")
    return hmac.compare_digest(given, f"Bearer {token}".encode())
