"""The one way the kit and its tests open a Docker SDK client, and the timeout policy for engine calls: a query
(inspect, list, ping) waits QUERY_TIMEOUT_S and an idempotent one is retried once; work that commits or streams
(build, remove, save/load, wait, a one-off container) goes through `for_work`, which waits WORK_TIMEOUT_S;
post-build housekeeping goes through `housekeeping`, which never fails the work it follows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

QUERY_TIMEOUT_S = 60
"""One query. Answers in milliseconds on an idle engine; a 2-core engine committing a 4.3 GB layer left one
unanswered for more than 10 s (a fresh machine's CI, issue 17)."""
QUERY_RETRIES = 1
"""A GET or HEAD that timed out or lost its connection is sent once more (nothing else: a POST may have acted)."""
WORK_TIMEOUT_S = 1800
"""One call that does work in the engine: removing a 10 GB image, loading a saved image, waiting for a container.
Builds pass no timeout at all: their stream shows progress line by line."""

T = TypeVar("T")


class DockerUnavailable(RuntimeError):
    """No engine answers at the address; the message is the reason, one line."""


def _retry_idempotent(api) -> None:
    from urllib3.util.retry import Retry

    retry = Retry(total=QUERY_RETRIES, connect=QUERY_RETRIES, read=QUERY_RETRIES, status=0, redirect=0,
                  allowed_methods=frozenset({"GET", "HEAD"}), backoff_factor=0.5, raise_on_status=False)
    for adapter in api.adapters.values():
        adapter.max_retries = retry


def client(base_url: str | None = None, timeout: int = QUERY_TIMEOUT_S):
    """A client of the local engine (DOCKER_HOST honoured) or of *base_url*, checked with a ping; raises
    DockerUnavailable with the reason."""
    import docker  # imported lazily: plan/render must work without an engine

    try:
        made = (docker.DockerClient(base_url=base_url, timeout=timeout) if base_url
                else docker.from_env(timeout=timeout))
        _retry_idempotent(made.api)
        made.ping()
    except Exception as exc:  # the SDK raises several types for "no engine"
        raise DockerUnavailable(str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__) from None
    made.grpo_base_url = base_url
    return made


def for_work(made):
    """The same engine with WORK_TIMEOUT_S per call, made once per client (a client of another kind is returned as
    it is)."""
    if not hasattr(made, "grpo_base_url"):
        return made
    work = getattr(made, "grpo_work", None)
    if work is None:
        work = client(made.grpo_base_url, timeout=WORK_TIMEOUT_S)
        made.grpo_work = work
    return work


def image_or_none(client, ref: str):
    """The image *ref* on the engine, or None when it has none of that name."""
    import docker.errors

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def housekeeping(what: str, call: Callable[[], T], log: Callable[[str], Any], default: T | None = None) -> T | None:
    """*call*() for a tidy-up after work that succeeded; if the engine fails or is slow to answer it, the problem is
    written to *log* and *default* returned — a finished build is never reported as failed for it."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - any engine or transport error; the work itself already succeeded
        reason = str(exc).splitlines()[0][:200] if str(exc) else ""
        log(f"note: {what} did not complete ({type(exc).__name__}: {reason}) - the image that was built is kept "
            "and used\n")
        return default
