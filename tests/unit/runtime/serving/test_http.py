"""What the replica proxy says over HTTP (runtime/serving/http.py): the error body in vLLM's shape, the replica's own
words read back from an error body (or a body that is not one), the headers passed on without the hop-by-hop ones,
and an answer as aiohttp's response."""

from __future__ import annotations

import json

from multidict import CIMultiDict

from grpo_deploy.runtime.serving.http import (
    HOP_BY_HOP,
    Answer,
    error_answer,
    forwarded_headers,
    reason_of,
    web_response,
)


def test_an_error_is_vllms_body_with_its_status():
    answer = error_answer(504, "adapter still not found", "GatewayTimeout")
    assert answer.status == 504 and answer.content_type == "application/json"
    assert json.loads(answer.body) == {"error": {"message": "adapter still not found", "type": "GatewayTimeout",
                                                 "code": 504}}
    assert reason_of(answer.body) == "adapter still not found"  # what the proxy reads back from a replica


def test_the_reason_of_a_body_that_is_no_vllm_error_is_its_start():
    assert reason_of(b'{"detail": "Not Found"}') == '{"detail": "Not Found"}'  # FastAPI's own 404
    assert reason_of(b"  upstream connect error\n") == "upstream connect error"
    assert reason_of(b'{"error": "flat"}') == '{"error": "flat"}'
    assert reason_of(b"\xff\xfe bad bytes") == "\ufffd\ufffd bad bytes"
    assert len(reason_of(b"x" * 10_000)) == 300
    assert len(reason_of(json.dumps({"error": {"message": "m" * 1000}}).encode())) == 300


def test_hop_by_hop_headers_are_dropped_whatever_their_case():
    headers = CIMultiDict({"Authorization": "Bearer t", "content-length": "12", "HOST": "proxy:8000",
                           "Connection": "keep-alive", "Transfer-Encoding": "chunked", "X-Request-Id": "7",
                           "Content-Type": "application/json"})
    assert forwarded_headers(headers) == {"Authorization": "Bearer t", "X-Request-Id": "7",
                                   "Content-Type": "application/json"}
    assert all(h == h.lower() for h in HOP_BY_HOP) and "proxy-authorization" in HOP_BY_HOP


def test_an_answer_becomes_a_response_with_its_status_body_and_type():
    response = web_response(Answer(202, b"Success", "text/plain"))
    assert response.status == 202 and response.body == b"Success" and response.content_type == "text/plain"
    assert web_response(error_answer(502, "down", "BadGateway")).content_type == "application/json"
