"""Process identity for every runtime entrypoint: the umask from GRPO_UMASK, and uid/gid/umask as events record them."""

from __future__ import annotations

import os

DEFAULT_UMASK = "0022"
UMASK_ENV = "GRPO_UMASK"


def parse_umask(text: str) -> int:
    """Octal umask such as `0022` or `022`; raises ValueError with the accepted form otherwise."""
    try:
        value = int(str(text).strip(), 8)
    except ValueError:
        raise ValueError(f"{UMASK_ENV}={text!r} is not an octal umask; use e.g. 0022") from None
    if not 0 <= value <= 0o777:
        raise ValueError(f"{UMASK_ENV}={text!r} is outside 0000-0777")
    return value


def format_mode(mode: int) -> str:
    """Four-digit octal string of permission bits, e.g. 0644."""
    return f"{mode & 0o7777:04o}"


def apply_umask(environ=os.environ) -> int:
    """Set the process umask from GRPO_UMASK (default 0022) and return it."""
    value = parse_umask(environ.get(UMASK_ENV) or DEFAULT_UMASK)
    os.umask(value)
    return value


def current_umask() -> int:
    """The process umask (read by setting it and putting it back)."""
    value = os.umask(0)
    os.umask(value)
    return value


def identity() -> dict:
    """uid, gid and umask of this process, as the runtime's JSON records spell them."""
    return {"uid": os.getuid(), "gid": os.getgid(), "umask": format_mode(current_umask())}
