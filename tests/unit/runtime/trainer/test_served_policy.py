"""The served-policy check: its rule over recorded answers (equal answers under a nonzero adapter, differing ones, a
zero adapter, early versions, the server's own noise, an adapter missing from the list), the answers read back
(junk, unreachable, over the bound: a logged line, no traceback), the B norm from the adapter's file, and the check in
its thread against a stub server."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest

from grpo_deploy.runtime.trainer import served_policy as sp
from tests.unit.runtime.stub_server import StubServer

BASE = "tiny-qwen2"


def probe(version: int, diff: float | None = 0.0, b: float | None = 1.0, listed: bool | None = True,
          noise: float | None = 0.0) -> sp.Probe:
    return sp.Probe(f"trl-policy-v{version}", version, listed, BASE, diff, noise, 20, b)


def verdicts(rule: sp.Rule, probes) -> list[str]:
    return [rule.judge(p).verdict for p in probes]


# ---------------------------------------------------------------- the rule


def test_equal_answers_under_a_nonzero_adapter_after_one_that_differed_make_a_finding_after_k():
    rule = sp.Rule()
    assert rule.judge(probe(1, diff=0.4, b=0.1)).verdict == "applied"
    found = [rule.judge(probe(v, diff=0.0, b=0.1 * v)) for v in (2, 3, 4)]
    assert [v.verdict for v in found] == ["base", "base", "base"]
    assert [v.finding is not None for v in found] == [False, False, True]
    values = found[-1].finding
    assert values["adapter"] == "trl-policy-v4" and values["verdict"] == "base" and values["syncs"] == sp.AFTER
    assert values["max_abs_diff"] == 0.0 and values["base"] == BASE
    assert rule.judge(probe(5)).finding is None  # once: the finding is not repeated while it lasts


def test_differing_answers_make_no_finding():
    rule = sp.Rule()
    assert all(rule.judge(probe(v, diff=0.05 * v, b=0.1 * v)).finding is None for v in range(1, 30))


def test_a_zero_adapter_equal_to_the_base_is_right_not_a_finding():
    rule = sp.Rule()
    assert set(verdicts(rule, [probe(v, diff=0.0, b=0.0) for v in range(1, 30)])) == {"early"}


def test_early_versions_are_not_judged_until_an_adapter_differed_or_min_version():
    rule = sp.Rule()
    early = [probe(v, diff=0.0, b=1e-6) for v in range(1, sp.MIN_VERSION)]
    assert set(verdicts(rule, early)) == {"early"}
    late = [rule.judge(probe(v, diff=0.0, b=1e-6)) for v in range(sp.MIN_VERSION, sp.MIN_VERSION + sp.AFTER)]
    assert late[-1].finding is not None  # the verl shape: never synced, the list lies, the probe catches it


def test_an_adapter_smaller_than_the_one_that_differed_is_not_judged_before_min_version():
    rule = sp.Rule()
    rule.judge(probe(1, diff=0.2, b=0.5))
    assert rule.judge(probe(2, diff=0.0, b=0.4)).verdict == "early"  # it may really move the probe less


def test_a_difference_just_over_the_threshold_proves_nothing():
    rule = sp.Rule()
    assert rule.judge(probe(1, diff=0.003, b=0.1, noise=0.0005)).verdict == "applied"  # a bf16 server's noise, maybe
    assert set(verdicts(rule, [probe(v, diff=0.0, b=0.1 * v) for v in range(2, 6)])) == {"early"}
    assert rule.judge(probe(6, diff=0.03, b=0.6)).verdict == "applied"  # ten thresholds: the server applies adapters
    assert rule.judge(probe(7, diff=0.0, b=0.7)).verdict == "base"


def test_the_servers_own_noise_raises_the_threshold():
    rule = sp.Rule()
    rule.judge(probe(1, diff=0.4, b=0.1))
    noisy = rule.judge(probe(2, diff=0.02, b=0.2, noise=0.01))  # a bf16 server: base against base differs by 0.01
    assert noisy.verdict == "base" and noisy.threshold == pytest.approx(sp.TOLERANCE + sp.NOISE_FACTOR * 0.01)
    assert rule.judge(probe(3, diff=0.5, b=0.3, noise=0.01)).verdict == "applied"


def test_a_check_noisier_than_the_proof_allowed_judges_nothing_and_keeps_the_streak():
    """Recorded on the CPU rehearsal (split run): a base request answered as the adapter now and then, so the two
    base answers differ by about the adapter's own difference; such a check read "equal to the base" before."""
    rule = sp.Rule()
    assert rule.judge(probe(2, diff=0.18, b=1.0)).verdict == "applied"  # proves: 0.18 >= 10 x 0.001
    seen = [rule.judge(probe(13, diff=0.81, b=2.0, noise=0.574)),  # threshold 1.72: wider than the proof allowed
            rule.judge(probe(14, diff=0.0, b=2.1)), rule.judge(probe(15, diff=0.0, b=2.2)),
            rule.judge(probe(16, diff=0.82, b=2.3, noise=0.774)), rule.judge(probe(17, diff=0.0, b=2.4))]
    assert [v.verdict for v in seen] == ["noisy", "base", "base", "noisy", "base"]
    assert [v.streak for v in seen] == [0, 1, 2, 2, 3] and seen[-1].finding is not None
    assert rule.judge(probe(18, diff=0.31, b=2.5, noise=0.02)).verdict == "applied"  # beyond a noisy threshold: counts


def test_an_applied_adapter_resets_the_streak_and_clears_an_active_finding():
    rule = sp.Rule(after=2)
    rule.judge(probe(1, diff=0.4))
    assert [rule.judge(probe(v)).finding is not None for v in (2, 3)] == [False, True]
    cleared = rule.judge(probe(4, diff=0.3))
    assert cleared.verdict == "applied" and cleared.clear and cleared.streak == 0


def test_an_adapter_missing_from_the_model_list_is_a_finding_at_once():
    rule = sp.Rule()
    found = rule.judge(probe(1, diff=None, listed=False))
    assert found.verdict == "not-listed" and found.finding["listed"] is False


def test_an_unreadable_check_is_unknown_and_keeps_the_streak():
    rule = sp.Rule()
    rule.judge(probe(1, diff=0.4))
    rule.judge(probe(2))
    assert rule.judge(probe(3, diff=None, listed=None)).verdict == "unknown"
    assert rule.judge(probe(4)).streak == 2


# ---------------------------------------------------------------- answers read back


def logprobs_answer(values, ids=True) -> dict:
    positions = [None] + [{str(10 + i): {"logprob": v, "rank": 1, "decoded_token": "x"}} for i, v in enumerate(values)]
    choice = {"text": "x", "prompt_logprobs": positions}
    if ids:
        choice["prompt_token_ids"] = list(range(9, 10 + len(values)))
    return {"choices": [choice]}


def test_prompt_logprobs_are_read_by_the_prompts_token_ids():
    assert sp.prompt_logprobs(logprobs_answer([-1.0, -2.5])) == [-1.0, -2.5]
    answer = logprobs_answer([-1.0])
    answer["choices"][0]["prompt_logprobs"][1]["99"] = {"logprob": -0.1}  # a top-k entry beside the prompt's token
    assert sp.prompt_logprobs(answer) == [-1.0]
    assert sp.prompt_logprobs(logprobs_answer([-3.0], ids=False)) == [-3.0]


@pytest.mark.parametrize("answer", [
    None, [], "text", {"choices": []}, {"choices": [{"prompt_logprobs": None}]},
    {"choices": [{"prompt_logprobs": [None]}]}, {"choices": [{"prompt_logprobs": [None, "x"]}]},
    {"choices": [{"prompt_logprobs": [None, {"1": {"logprob": "nan"}}]}]},
    {"choices": [{"prompt_logprobs": [None, {"1": {"logprob": True}}]}]},
    {"choices": [{"prompt_logprobs": [None, {"1": {"logprob": float("inf")}}]}]},
    {"choices": [{"prompt_logprobs": [None, {"1": {"logprob": -1}, "2": {"logprob": -2}}]}]},
])
def test_junk_logprobs_are_unreadable_not_a_traceback(answer):
    with pytest.raises(sp.Unreadable):
        sp.prompt_logprobs(answer)


def test_the_model_list_and_its_base():
    models = sp.listed_models({"data": [{"id": BASE}, {"id": "trl-policy-v1", "parent": BASE}, {"id": 3}, "x"]})
    assert models == {BASE: None, "trl-policy-v1": BASE}
    assert sp.base_of(models, "trl-policy-v1") == BASE
    assert sp.base_of({BASE: None, "trl-policy-v1": None}, "trl-policy-v1") == BASE  # no parent: the one non-adapter
    assert sp.base_of({"a": None, "b": None}, "trl-policy-v1") is None
    for junk in (None, {"data": "x"}, [1]):
        with pytest.raises(sp.Unreadable):
            sp.listed_models(junk)


class Raw:
    def __init__(self, body: bytes):
        self.stream = io.BytesIO(body)

    def read(self, n, decode_content=True):
        return self.stream.read(n)


class Response:
    def __init__(self, status: int, body: bytes):
        self.status_code, self.raw = status, Raw(body)

    def close(self):
        pass


class Session:
    """Answers by (method, path) with (status, raw bytes), or raises the exception given."""

    def __init__(self, routes):
        self.routes, self.calls = routes, []

    def request(self, method, url, json=None, timeout=None, stream=False):
        path = "/" + url.split("/", 3)[3]
        self.calls.append((method, path, json, timeout))
        answer = self.routes[(method, path)]
        if isinstance(answer, Exception):
            raise answer
        status, body = answer(json) if callable(answer) else answer
        return Response(status, body)


def server(adapter_logprobs, base_logprobs, listed=True) -> Session:
    models = [{"id": BASE}] + ([{"id": f"trl-policy-v{v}", "parent": BASE} for v in range(1, 9)] if listed else [])

    def complete(body):
        values = base_logprobs if body["model"] == BASE else adapter_logprobs
        return 200, json.dumps(logprobs_answer(values)).encode()

    return Session({("GET", "/v1/models"): (200, json.dumps({"data": models}).encode()),
                    ("POST", "/v1/completions"): complete})


def test_the_probe_asks_the_list_then_scores_base_adapter_base():
    session = server([-1.0, -2.0], [-1.5, -2.0])
    found = sp.probe(session, "http://s", "trl-policy-v3", 3, "/nowhere")
    assert found.listed and found.base == BASE and found.diff == pytest.approx(0.5) and found.noise == 0.0
    assert found.tokens == 2 and found.b_norm is None and found.error is None
    models = [c[2]["model"] for c in session.calls if c[1] == "/v1/completions"]
    assert models == [BASE, "trl-policy-v3", BASE]
    body = session.calls[1][2]
    assert body["max_tokens"] == 1 and body["prompt_logprobs"] == 0 and body["prompt"] == sp.PROBE_TEXT
    assert all(c[3] == sp.TIMEOUT_S for c in session.calls)


def test_the_probe_of_an_unlisted_adapter_asks_nothing_more():
    session = server([-1.0], [-1.0], listed=False)
    found = sp.probe(session, "http://s", "trl-policy-v3", 3, "/nowhere")
    assert found.listed is False and found.diff is None and len(session.calls) == 1


@pytest.mark.parametrize("route, why", [
    (ConnectionError("refused"), "ConnectionError"),
    (TimeoutError(), "TimeoutError"),
    ((500, b"oops"), "HTTP 500"),
    ((200, b"{not json"), "not JSON"),
    ((200, b"[" * 100_000 + b"]" * 100_000), "not JSON"),
    ((200, b" " * (sp.BODY_LIMIT + 1)), "over"),
    ((200, b'{"data": 5}'), "no model list"),
])
def test_an_unreachable_or_junk_server_is_an_error_line_not_a_traceback(route, why):
    session = Session({("GET", "/v1/models"): route})
    found = sp.probe(session, "http://s", "trl-policy-v3", 3, "/nowhere")
    assert found.diff is None and why in found.error and "\n" not in found.error


def test_junk_completions_leave_the_check_unknown():
    session = server([-1.0], [-1.0])
    session.routes[("POST", "/v1/completions")] = (200, b'{"choices": [{"text": "x"}]}')
    found = sp.probe(session, "http://s", "trl-policy-v3", 3, "/nowhere")
    assert found.listed and found.diff is None and "prompt_logprobs" in found.error


def test_b_norm_of_the_adapters_file(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    zero = tmp_path / "zero"
    zero.mkdir()
    safetensors_torch.save_file({"m.lora_A.weight": torch.ones(2, 4), "m.lora_B.weight": torch.zeros(4, 2)},
                                str(zero / sp.WEIGHTS_FILE))
    assert sp.b_norm(str(zero)) == 0.0
    moved = tmp_path / "moved"
    moved.mkdir()
    safetensors_torch.save_file({"a.lora_B.weight": torch.full((2, 2), 3.0, dtype=torch.bfloat16),
                                 "b.lora_B.weight": torch.full((1, 1), 4.0)}, str(moved / sp.WEIGHTS_FILE))
    assert sp.b_norm(str(moved)) == pytest.approx((4 * 9 + 16) ** 0.5)
    assert sp.b_norm(str(tmp_path / "none")) is None
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / sp.WEIGHTS_FILE).write_bytes(b"\x00" * 16)
    assert sp.b_norm(str(tmp_path / "junk")) is None
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / sp.WEIGHTS_FILE).symlink_to(moved / sp.WEIGHTS_FILE)
    assert sp.b_norm(str(tmp_path / "link")) is None


# ---------------------------------------------------------------- the check in a trainer


def test_the_check_emits_each_verdict_and_delivers_one_finding():
    events, delivered = [], []
    check = sp.ServedPolicyCheck("http://s", lambda e, **f: events.append((e, f)) or f, delivered.append,
                                 rule=sp.Rule(after=2), session=server([-1.0, -2.0], [-1.0, -2.0]))
    check.rule.judge(probe(1, diff=0.4, b=None))  # an earlier adapter differed: the path applies adapters
    for v in (2, 3, 4):
        check.check(f"trl-policy-v{v}", v, "/nowhere")
    assert [f["verdict"] for e, f in events] == ["base", "base", "base"]  # no B norm read: the list and the probe
    assert all(e == "served_policy" and f["listed"] is True and f["diff"] == 0.0 for e, f in events)
    (report,) = delivered
    assert report["adapter"] == "trl-policy-v3" and report["verdict"] == "base" and report["clear"] is False


def test_without_a_watcher_the_finding_is_one_warning_line(caplog):
    check = sp.ServedPolicyCheck("http://s", lambda e, **f: f, None, session=server([-1.0], [-1.0], listed=False))
    with caplog.at_level(logging.WARNING, logger="grpo_deploy.runtime.trainer.served_policy"):
        check.check("trl-policy-v3", 3, "/nowhere")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("stale policy: ") and "trl-policy-v3" in line and "\n" not in line


def test_an_unreachable_server_logs_and_does_not_fail(caplog):
    events = []
    check = sp.ServedPolicyCheck("http://127.0.0.1:9", lambda e, **f: events.append(f) or f, None)
    with caplog.at_level(logging.WARNING):
        verdict = check.check("trl-policy-v3", 3, "/nowhere")
    assert verdict.verdict == "unknown" and events[0]["error"]
    assert any("could not judge" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)


def test_submit_checks_due_policy_versions_in_a_thread_against_a_real_http_server():
    answer = logprobs_answer([-1.0, -2.0])
    routes = {("GET", "/v1/models"): (200, {"data": [{"id": BASE}, {"id": "trl-policy-v2", "parent": BASE}]}),
              ("POST", "/v1/completions"): (200, answer)}
    events = []
    with StubServer(routes) as stub:
        check = sp.ServedPolicyCheck(stub.url, lambda e, **f: events.append(f) or f, None, every=2)
        check.submit("base-model", "/x")  # not a policy version
        check.submit("trl-policy-v1", "/x/trl-policy-v1")  # not due
        check.submit("trl-policy-v2", "/x/trl-policy-v2")
        deadline = time.monotonic() + 10
        while not events and time.monotonic() < deadline:
            time.sleep(0.02)
    assert [e["adapter"] for e in events] == ["trl-policy-v2"] and events[0]["diff"] == 0.0
    assert [r[1] for r in stub.requests] == ["/v1/models"] + ["/v1/completions"] * 3
