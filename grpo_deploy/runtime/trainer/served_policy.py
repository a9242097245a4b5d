"""The served-policy check (trl-async, rank 0, HTTP only): after an adapter load the server acknowledged, is the newest
adapter really what the server serves? It asks the server's model list and scores one fixed probe text under the
adapter's name and under the base model's, judges the answers over syncs (`Rule`, pure), and hands a finding to the run
watcher (watch/run_watch.py) when the server keeps answering as the base model.

Why: a load answered 200 but never applied, an adapter evicted or never synced, leave the rollouts sampling the
initial policy while nothing crashes (the mean importance ratio of base-model samples still averages ~1, so the
watcher's ratio band rarely sees it). The check runs in a background thread after each checked load, so it never
waits on the paused server, and never runs a forward pass (other trainer ranks would hang in a collective).
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from grpo_deploy.runtime import run_token
from grpo_deploy.runtime.serving import model_list
from grpo_deploy.runtime.storage.adapters import VERSION_PATTERN, WEIGHTS_FILE
from grpo_deploy.runtime.watch.watcher import stale_policy_message

log = logging.getLogger("grpo_deploy.runtime.trainer.served_policy")

PROBE_TEXT = "The served policy probe: 12 + 30 = 42, and the quick brown fox jumps over the lazy dog."
"""Scored token by token (vLLM's prompt_logprobs) under the adapter and under the base model: printable ASCII, so the
rehearsal's one-token-per-character tokenizer and Qwen's both take it."""
EVERY = 1
"""Check every Nth adapter version (by its number): two base probes, one adapter probe and one model list each."""
AFTER = 3
"""Checked syncs in a row whose adapter should differ from the base, and whose answers do not, before a finding."""
TOLERANCE = 1e-3
"""Largest |logprob difference| over the probe's tokens that still counts as "the same answers", beyond the noise the
server shows between two base probes (an fp32 CPU server repeats itself exactly; a bf16 GPU server does not)."""
NOISE_FACTOR = 3.0
"""The threshold is TOLERANCE + NOISE_FACTOR x the difference between the two base probes of the same check."""
PROOF_FACTOR = 10.0
"""An adapter proves that the server applies adapters when it moves the probe by at least this many thresholds: a
difference just over the threshold may be the server's noise (a bf16 GPU), not the adapter."""
MIN_VERSION = 20
"""Before any adapter of this run proved that the server applies adapters, versions below this are not judged: an
adapter a few optimizer steps old may move the probe less than the tolerance (LoRA's B starts at zero; on the CPU
rehearsal one step at lr 5e-3 moves it 0.08, at a GPU recipe's lr 1e-5 a few hundred times less)."""
TIMEOUT_S = 30.0
"""Each request's time bound (the server is busy with rollouts; a probe waits its turn)."""
BODY_LIMIT = 1024 * 1024
"""Bytes read back from one answer: a probe's answer is a few kilobytes."""
TOKENS_LIMIT = 512
"""Probe positions read back."""
WEIGHTS_LIMIT = 8 * 1024**3
"""Largest adapter weights file whose B norm is read (a rank-64 adapter of a 70B model is ~1.7 GB)."""


@dataclass(frozen=True)
class Probe:
    """One check's evidence. `listed`: the adapter is in GET /v1/models (None: unknown); `diff`: the largest |logprob
    difference| between the adapter's and the base's answers over the probe's tokens; `noise`: the same between two
    base probes; `b_norm`: the Frobenius norm of the adapter's LoRA B matrices (0: the adapter equals the base)."""

    adapter: str
    version: int
    listed: bool | None = None
    base: str | None = None
    diff: float | None = None
    noise: float | None = None
    tokens: int = 0
    b_norm: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Verdict:
    """`verdict`: applied (answers differ from the base), base (the same while the adapter should differ), early (the
    same, but the adapter may not move the probe yet), noisy (the server's two base answers disagree by more than the
    proof tolerated: no judgement, the streak kept), not-listed, unknown (no answer to judge); `finding`: the
    values to hand to the watcher when this check calls for one (None otherwise); `clear`: a finding ended."""

    verdict: str
    threshold: float | None
    streak: int
    finding: dict[str, Any] | None = None
    clear: bool = False


class Rule:
    """The served-policy rule over one run's checks (pure). A check is judged when its adapter should answer
    differently from the base: its B norm is nonzero, and either an earlier adapter of this run with no larger B norm
    moved the probe by PROOF_FACTOR thresholds or more (the server applies adapters, and this one moved at least as
    far, so it should differ by about as much; without norms to compare, an earlier version), or it is version
    MIN_VERSION or later. `after` judged checks in a row whose answers equal the base's (within TOLERANCE +
    NOISE_FACTOR x the check's own base-to-base noise) make a finding; an adapter missing from the model list makes
    one at once. A check whose own noise makes its threshold wider than the proof allowed (the proving difference
    over PROOF_FACTOR) judges nothing: on the CPU rehearsal a base-model request batched with adapter requests was
    now and then answered as the adapter (2-3 of 36 checks), and such a check would read "equal to the base"."""

    def __init__(self, after: int = AFTER, tolerance: float = TOLERANCE, noise_factor: float = NOISE_FACTOR,
                 min_version: int = MIN_VERSION):
        self.after, self.tolerance, self.noise_factor, self.min_version = after, tolerance, noise_factor, min_version
        self.streak = 0
        self.proven_b: float | None = None  # the smallest B norm of an adapter that proved it (PROOF_FACTOR)
        self.proven_version: int | None = None  # the first version that proved it
        self.proven_diff: float | None = None  # the smallest difference that proved it
        self.proven = False
        self.active = False

    def judge(self, probe: Probe) -> Verdict:
        if probe.listed is False:
            self.streak = 0
            return self._found("not-listed", None, probe)
        if probe.diff is None:
            return Verdict("unknown", None, self.streak)
        threshold = self.tolerance + self.noise_factor * (probe.noise or 0.0)
        if self.proven_diff is not None and threshold * PROOF_FACTOR > self.proven_diff and probe.diff <= threshold:
            return Verdict("noisy", threshold, self.streak)
        if probe.diff > threshold:
            self.streak = 0
            if probe.diff >= PROOF_FACTOR * threshold:
                self.proven = True
                if self.proven_version is None:
                    self.proven_version = probe.version
                self.proven_diff = probe.diff if self.proven_diff is None else min(self.proven_diff, probe.diff)
                if probe.b_norm is not None:
                    self.proven_b = probe.b_norm if self.proven_b is None else min(self.proven_b, probe.b_norm)
            clear, self.active = self.active, False
            return Verdict("applied", threshold, 0, clear=clear)
        if not self._expected(probe):
            return Verdict("early", threshold, self.streak)
        self.streak += 1
        if self.streak < self.after:
            return Verdict("base", threshold, self.streak)
        return self._found("base", threshold, probe)

    def _expected(self, probe: Probe) -> bool:
        if probe.b_norm is not None and probe.b_norm <= 0:
            return False  # B is zero: the adapter is the base model, equal answers are right
        if self.proven and self.proven_b is not None and probe.b_norm is not None:
            if probe.b_norm >= self.proven_b:
                return True
        elif self.proven and probe.version > self.proven_version:
            return True  # no norm to compare: a later version than one that proved it
        return probe.version >= self.min_version

    def _found(self, verdict: str, threshold: float | None, probe: Probe) -> Verdict:
        if self.active:
            return Verdict(verdict, threshold, self.streak)
        self.active = True
        values = {"adapter": probe.adapter, "verdict": verdict, "listed": probe.listed, "base": probe.base,
                  "max_abs_diff": probe.diff, "threshold": threshold, "syncs": max(self.streak, 1),
                  "b_norm": probe.b_norm}
        return Verdict(verdict, threshold, self.streak, finding=values)


def _g(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "unknown"


# ---------------------------------------------------------------- reading the server and the adapter


class Unreadable(Exception):
    """An answer that cannot be used (unreachable, an HTTP error, junk): its one-line reason."""


def _get_json(session, method: str, url: str, body: dict | None = None, timeout: float = TIMEOUT_S) -> Any:
    """One request, its answer read bounded and parsed; Unreadable with a one-line reason otherwise."""
    try:
        response = session.request(method, url, json=body, timeout=timeout, stream=True)
    except Exception as error:  # noqa: BLE001 - any transport failure is one reason
        raise Unreadable(f"{method} {url}: {type(error).__name__}") from None
    try:
        raw = response.raw.read(BODY_LIMIT + 1, decode_content=True)
    except Exception as error:  # noqa: BLE001
        raise Unreadable(f"{method} {url}: reading the answer: {type(error).__name__}") from None
    finally:
        response.close()
    if response.status_code != 200:
        raise Unreadable(f"{method} {url}: HTTP {response.status_code}")
    if len(raw) > BODY_LIMIT:
        raise Unreadable(f"{method} {url}: answer over {BODY_LIMIT} bytes")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise Unreadable(f"{method} {url}: not JSON") from None


def listed_models(answer: Any) -> dict[str, str | None]:
    """GET /v1/models' answer as {id: parent}; Unreadable when it is not vLLM's list."""
    models = model_list.entries(answer)
    if models is None:
        raise Unreadable("GET /v1/models: no model list")
    return models


base_of = model_list.base_of


def prompt_logprobs(answer: Any) -> list[float]:
    """The probe's per-token logprobs from a /v1/completions answer asked with prompt_logprobs=0 (the first token has
    none); Unreadable when the answer does not hold them."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    positions = choice.get("prompt_logprobs") if choice else None
    if not isinstance(positions, list) or len(positions) < 2:
        raise Unreadable("no prompt_logprobs in the completion")
    ids = choice.get("prompt_token_ids")
    out = []
    for i, position in enumerate(positions[1:TOKENS_LIMIT + 1], start=1):
        if not isinstance(position, dict) or not position:
            raise Unreadable(f"prompt_logprobs[{i}] is not a token's logprob")
        key = str(ids[i]) if isinstance(ids, list) and i < len(ids) and isinstance(ids[i], int) else None
        entry = position.get(key) if key in position else (next(iter(position.values())) if len(position) == 1
                                                             else None)
        value = entry.get("logprob") if isinstance(entry, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise Unreadable(f"prompt_logprobs[{i}] holds no finite logprob")
        out.append(float(value))
    return out


def max_abs_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        raise Unreadable(f"the probe scored {len(a)} tokens under one name and {len(b)} under the other")
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def b_norm(adapter_path: str) -> float | None:
    """The Frobenius norm of every LoRA B matrix in the adapter's weights file (the trainer's own, just published);
    None when it cannot be read."""
    path = os.path.join(adapter_path, WEIGHTS_FILE)
    try:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > WEIGHTS_LIMIT:
            return None
        from safetensors import safe_open

        total = 0.0
        with safe_open(path, framework="pt") as weights:
            for key in weights.keys():
                if "lora_B" in key:
                    total += float(weights.get_tensor(key).float().pow(2).sum())
        return math.sqrt(total) if math.isfinite(total) else None
    except Exception as error:  # noqa: BLE001 - a norm we cannot read leaves the rule on the version gate
        log.info(f"served-policy check: the B norm of {path} is not read: {type(error).__name__}")
        return None


def probe(session, server_url: str, adapter: str, version: int, adapter_path: str) -> Probe:
    """One check against the server: the model list, then the probe scored as the base, the adapter, the base."""
    url = server_url.rstrip("/")
    norm = b_norm(adapter_path)
    try:
        models = listed_models(_get_json(session, "GET", f"{url}/v1/models"))
    except Unreadable as why:
        return Probe(adapter, version, b_norm=norm, error=str(why))
    listed, base = adapter in models, base_of(models, adapter)
    if not listed or base is None:
        return Probe(adapter, version, listed, base, b_norm=norm,
                     error=None if not listed else "no base model in GET /v1/models")

    def score(model: str) -> list[float]:
        body = {"model": model, "prompt": PROBE_TEXT, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0,
                "return_token_ids": True}
        return prompt_logprobs(_get_json(session, "POST", f"{url}/v1/completions", body))

    try:
        first, served, second = score(base), score(adapter), score(base)
        return Probe(adapter, version, True, base, max_abs_diff(served, first), max_abs_diff(second, first),
                     len(first), norm)
    except Unreadable as why:
        return Probe(adapter, version, True, base, b_norm=norm, error=str(why))


# ---------------------------------------------------------------- the check in a running trainer


class ServedPolicyCheck:
    """Checks adapter loads in a background thread, one at a time (a load that arrives while one is checked replaces
    any still waiting: only the newest matters). Each check emits a `served_policy` event; a finding goes to `deliver`
    (the run watcher's inbox) or, without a watcher, to the log as one warning line. Never raises into training."""

    def __init__(self, server_url: str, emit: Callable[..., dict], deliver: Callable[[dict], None] | None = None,
                 rule: Rule | None = None, every: int = EVERY, session=None):
        self.server_url, self.emit, self.deliver = server_url, emit, deliver
        self.rule, self.every = rule or Rule(), max(1, every)
        self.session = session
        self._waiting: queue.Queue = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, adapter: str, adapter_path: str) -> None:
        """After a load answered 200: queue *adapter* for a check when its version is due."""
        match = VERSION_PATTERN.match(adapter)
        if match is None or int(match.group(1)) % self.every:
            return
        with self._lock:
            try:
                self._waiting.get_nowait()  # an older load not checked yet: the newest replaces it
            except queue.Empty:
                pass
            self._waiting.put_nowait((adapter, int(match.group(1)), adapter_path))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="served-policy-check", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            adapter, version, path = self._waiting.get()
            try:
                self.check(adapter, version, path)
            except Exception as error:  # noqa: BLE001 - the check must never end training
                log.warning(f"served-policy check of {adapter} failed: {type(error).__name__}: {error}")

    def check(self, adapter: str, version: int, adapter_path: str) -> Verdict:
        """Probe the server once and judge (also called directly by tests)."""
        if self.session is None:
            import requests

            self.session = requests.Session()
            self.session.headers.update(run_token.env_headers())  # a front asks for the run's token
        found = probe(self.session, self.server_url, adapter, version, adapter_path)
        verdict = self.rule.judge(found)
        self.emit("served_policy", **{k: v for k, v in asdict(found).items()}, verdict=verdict.verdict,
                  threshold=verdict.threshold, streak=verdict.streak)
        if found.error is not None:
            log.warning(f"served-policy check of {adapter} could not judge: {found.error}")
        else:
            log.info(f"served-policy check of {adapter}: {verdict.verdict} (listed {found.listed}, max |diff| "
                     f"{_g(found.diff)}, threshold {_g(verdict.threshold)}, B norm {_g(found.b_norm)})")
        if verdict.finding is not None or verdict.clear:
            report = {**(verdict.finding or {"adapter": adapter, "verdict": verdict.verdict}), "clear": verdict.clear}
            if self.deliver is not None:
                self.deliver(report)
            elif verdict.finding is not None:
                log.warning(stale_policy_message(verdict.finding))
        return verdict
