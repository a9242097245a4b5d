"""What the replica proxy says over HTTP: an answer (status, body, content type) and how it becomes aiohttp's response,
the error body in vLLM's shape, the replica's own words read back from one, and the headers passed on (hop-by-hop
ones dropped)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from aiohttp import web

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Host",
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Keep-Alive",
        "Upgrade",
        "TE",
        "Trailer",
        "Proxy-Authorization",
        "Proxy-Authenticate",
    )
)


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)  # more headers (a 405's Allow)


def error_answer(status: int, message: str, kind: str) -> Answer:
    return Answer(status, json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode())


def reason_of(body: bytes) -> str:
    """The replica's own words from a vLLM error body, else the body's start."""
    text = body.decode(errors="replace")
    try:
        return str(json.loads(text)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return text.strip()[:300]


def forwarded_headers(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


def web_response(answer: Answer) -> web.Response:
    return web.Response(status=answer.status, body=answer.body,
                        headers={**answer.headers, "Content-Type": answer.content_type})
