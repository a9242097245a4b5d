"""The replica proxy: one vLLM base URL in front of N vLLM servers for TRL's async GRPO with adapter sync. It owns the
routing of completions by prompt-prefix affinity, the broadcast of adapter loads (all-or-nothing), unloads, pause,
resume and prefix-cache resets, the fan-in of health and of the model list, each replica's health and adapter resync,
`/proxy/stats`, and its command line (arguments also from an @FILE, read bounded)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from grpo_deploy.common.readback import ReadRefused, read_text
from grpo_deploy.runtime.serving.prefix_router import PrefixRouter, prompt_of
from grpo_deploy.runtime.storage.faults import ADAPTER_NOT_FOUND

log = logging.getLogger("grpo_deploy.replica_proxy")

# What TRL 1.16's async GRPO (vllm_client.py, async_rollout_worker.py) and the kit (adapters.py, trl_hooks.py) call.
ROUTED = ("/v1/completions", "/v1/chat/completions")
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
# The union over the replicas: a stale-adapter sweep through the proxy sees what any replica holds (its unloads are
# broadcast), and a name one replica lacks still shows.
MODELS = "/v1/models"
BROADCAST = ("/pause", "/resume", "/reset_prefix_cache")
FAN_IN = ("/health", "/ping")
# TRL's merged (NCCL) sync sizes its group from one server and would reach one replica: refused, not forwarded.
WEIGHT_TRANSFER = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update")
STATS = "/proxy/stats"
ARGS_FILE_LIMIT = 64 * 1024  # an @FILE of arguments: a few hundred lines at most

# vLLM's answer when the adapter folder is not (yet) visible to the server: a mount that lags. FastAPI's own 404
# {"detail": "Not Found"} (runtime LoRA updating off) does not match and is passed through: TRL words that one.
LAGGING = re.compile(ADAPTER_NOT_FOUND, re.I)
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.25, 4.0
HEALTH_TIMEOUT_S = 5.0
BROADCAST_TIMEOUT_S = 900.0
# Below uvicorn's keep-alive (vLLM: 5 s), so the proxy never reuses a connection the replica is closing.
KEEPALIVE_S = 3.0
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


# ---------------------------------------------------------------- the server


@dataclass(eq=False)
class Replica:
    url: str
    healthy: bool = False
    why: str = "not probed yet"
    in_flight: int = 0
    requests: int = 0
    errors: int = 0
    loads_ok: int = 0
    loads_failed: int = 0
    loads_retried: int = 0
    resyncs: int = 0
    last_load_s: float | None = None


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"


@dataclass
class _Adapter:
    body: bytes
    headers: dict[str, str]


@dataclass
class _Outcome:
    kind: str  # ok | refused | lagging | gone
    answer: Answer | None = None
    tries: int = 1


@dataclass
class Settings:
    """The proxy's knobs; the command line's defaults come from here."""

    block_size: int = 16
    """Tokens per prefix block: vLLM's default KV block size, so a matching block is a cached one."""
    imbalance: int = 8
    """Requests in flight a replica may have beyond the least loaded one and still win on affinity."""
    load_retry_s: float = 300.0
    """How long an adapter load answered "No adapter found" (a mount that lags) is tried again before 504."""
    connect_timeout_s: float = 2.0
    """Connect timeout to a replica: a dead one is a 502 after this long, never a hang."""
    health_interval_s: float = 2.0
    """Seconds between GET /health probes of each replica."""
    max_blocks: int = 500_000
    """Prefix blocks remembered (least recently used dropped)."""


def _error(status: int, message: str, kind: str) -> Answer:
    return Answer(status, json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode())


def _reason(body: bytes) -> str:
    """The replica's own words from a vLLM error body, else the body's start."""
    text = body.decode(errors="replace")
    try:
        return str(json.loads(text)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return text.strip()[:300]


def _forwarded(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


def _response(answer: Answer) -> web.Response:
    return web.Response(status=answer.status, body=answer.body, headers={"Content-Type": answer.content_type})


@dataclass
class _Load:
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    last_s: float | None = None
    failed: int = 0

    def add(self, seconds: float) -> None:
        self.count, self.total_s, self.last_s = self.count + 1, self.total_s + seconds, seconds
        self.max_s = max(self.max_s, seconds)


class ReplicaProxy:
    """The proxy's state and its aiohttp application (`app()`); adapter changes and resyncs are serialised."""

    def __init__(self, urls: list[str], settings: Settings | None = None):
        self.settings = settings or Settings()
        self.replicas = [Replica(url.rstrip("/")) for url in urls]
        s = self.settings
        self.router = PrefixRouter(len(urls), s.block_size, s.imbalance, s.max_blocks)
        self.routes: Counter = Counter()  # hit, miss, spill
        self.adapters: OrderedDict[str, _Adapter] = OrderedDict()  # loaded everywhere, oldest first
        self.paused: str | None = None  # the query of the last /pause not yet resumed
        self.loads = _Load()
        self.session: aiohttp.ClientSession | None = None
        self._lock: asyncio.Lock | None = None
        self._watchers: list[asyncio.Task] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout_s)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        self._lock = asyncio.Lock()
        self._watchers = [asyncio.create_task(self._watch(i)) for i in range(len(self.replicas))]

    async def _stop(self, _app) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in ROUTED and request.method == "POST":
            return await self._routed(request)
        if path == LOAD:
            return _response(await self._load(request))
        if path == UNLOAD:
            return _response(await self._unload(request))
        if path in BROADCAST:
            return _response(await self._broadcast(request))
        if path in FAN_IN:
            return _response(self._health())
        if path == STATS:
            return web.json_response(self.stats())
        if path == MODELS and request.method == "GET":
            return _response(await self._models(request))
        if path in WEIGHT_TRANSFER:
            return _response(
                _error(
                    501,
                    f"{path} cannot go through the replica proxy: merged (NCCL) weight sync "
                    "reaches one replica; use adapter sync (a LoRA model, --enable-lora)",
                    "NotImplemented",
                )
            )
        return await self._forward(request)

    # ---- health

    def _down(self, i: int, why: str) -> None:
        replica = self.replicas[i]
        if replica.healthy:
            log.warning(
                f"replica {replica.url} is down: {why}; not routed to until it answers /health and is "
                "given the current adapters"
            )
            self.router.forget_replica(i)
        replica.healthy, replica.why = False, why

    async def _probe(self, replica: Replica) -> str | None:
        """None when the replica answers GET /health with 200, else why not."""
        try:
            async with self.session.get(
                f"{replica.url}/health",
                timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S, sock_connect=self.settings.connect_timeout_s),
            ) as response:
                await response.read()
                return None if response.status == 200 else f"/health answered {response.status}"
        except (aiohttp.ClientError, TimeoutError) as error:
            return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__

    async def _watch(self, i: int) -> None:
        replica = self.replicas[i]
        while True:
            try:
                why = await self._probe(replica)
                if why is not None:
                    self._down(i, why)
                elif not replica.healthy:
                    async with self._lock:
                        await self._rejoin(i)
            except Exception as error:  # noqa: BLE001 - the watcher must outlive a surprise; the replica stays down
                self._down(i, f"health watcher: {type(error).__name__}: {error}")
                log.exception(f"health watcher of {replica.url}")
            await asyncio.sleep(self.settings.health_interval_s)

    async def _rejoin(self, i: int) -> None:
        """Give a replica that answers again every adapter it lacks (oldest first) and the pause in force, then route
        to it. Held under the lock, so no broadcast slips between the resync and the replica's return; a failed
        resync leaves it down until the next probe."""
        replica = self.replicas[i]
        have = await self._listed(replica) if self.adapters else set()
        if have is None:
            return
        given = []
        for name, adapter in self.adapters.items():
            if name in have:
                continue
            # one try: a replica that cannot see the adapter yet must not hold every broadcast for the retry
            # budget; the next probe tries again
            outcome = await self._load_one(replica, adapter.body, adapter.headers, budget_s=0)
            if outcome.kind != "ok":
                replica.why = f"resync of adapter {name} failed ({outcome.kind})"
                return
            given.append(name)
        if self.paused is not None:
            paused = await self._call(replica, "POST", "/pause" + self.paused, b"", {})
            if paused is None or paused.status != 200:
                replica.why = "resync: /pause failed"
                return
        replica.healthy, replica.why = True, "ok"
        replica.resyncs += 1
        log.info(
            f"replica {replica.url} is up; adapters given: {', '.join(given) or 'none missing'}"
            f"{'; paused as the others' if self.paused is not None else ''}; routed to"
        )

    async def _listed(self, replica: Replica) -> set[str] | None:
        """The model names a replica serves (GET /v1/models, with the last load's Authorization: vLLM guards /v1)."""
        headers = next(reversed(self.adapters.values())).headers
        listed = await self._call(replica, "GET", "/v1/models", b"", headers, timeout=HEALTH_TIMEOUT_S)
        if listed is None or listed.status != 200:
            replica.why = "GET /v1/models failed: " + ("unreachable" if listed is None else f"HTTP {listed.status}")
            return None
        try:
            return {entry["id"] for entry in json.loads(listed.body)["data"]}
        except (ValueError, KeyError, TypeError):
            return set()

    def _health(self) -> Answer:
        down = [r for r in self.replicas if not r.healthy]
        n = len(self.replicas)
        if not down:
            return Answer(200, json.dumps({"healthy": n, "replicas": n}).encode())
        detail = "; ".join(f"{r.url}: {r.why}" for r in down)
        return _error(503, f"{len(down)}/{n} replicas unhealthy: {detail}", "ServiceUnavailable")

    # ---- upstream calls

    async def _call(
        self,
        replica: Replica,
        method: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        timeout: float = BROADCAST_TIMEOUT_S,
    ) -> Answer | None:
        """One request to one replica; None when it cannot be reached (it is then marked down). A body the proxy sends
        on its own (a resync) is JSON: without the header aiohttp says octet-stream and vLLM's FastAPI sees no body."""
        if body and not any(k.lower() == "content-type" for k in headers):
            headers = {**headers, "Content-Type": "application/json"}
        try:
            async with self.session.request(
                method,
                replica.url + path,
                data=body or None,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=self.settings.connect_timeout_s),
            ) as response:
                return Answer(
                    response.status,
                    await response.read(),
                    response.headers.get("Content-Type", "application/octet-stream"),
                )
        except (aiohttp.ClientError, TimeoutError) as error:
            replica.errors += 1
            self._down(self.replicas.index(replica), f"{method} {path}: {type(error).__name__}: {error}")
            return None

    def _healthy(self) -> list[int]:
        return [i for i, r in enumerate(self.replicas) if r.healthy]

    async def _relay(self, request: web.Request, i: int, body: bytes) -> web.StreamResponse | None:
        """Pass *request* to replica *i* and its answer back (streamed when it streams). None when the replica could
        not be connected to (nothing was sent): the caller may try another one."""
        replica = self.replicas[i]
        try:
            upstream = await self.session.request(
                request.method, replica.url + request.path_qs, data=body or None, headers=_forwarded(request.headers)
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as error:
            replica.errors += 1
            self._down(i, f"{type(error).__name__}: {error}")
            return None
        except (aiohttp.ClientError, TimeoutError) as error:
            replica.errors += 1
            return _response(_error(502, f"replica {replica.url}: {type(error).__name__}: {error}", "BadGateway"))
        try:
            headers = _forwarded(upstream.headers)
            if upstream.content_type != "text/event-stream":
                return web.Response(status=upstream.status, body=await upstream.read(), headers=headers)
            out = web.StreamResponse(status=upstream.status, headers=headers)
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
        except (aiohttp.ClientError, TimeoutError) as error:
            replica.errors += 1
            return _response(
                _error(502, f"replica {replica.url} broke off: {type(error).__name__}: {error}", "BadGateway")
            )
        finally:
            upstream.release()

    def _nobody(self, tried: list[int]) -> web.Response:
        if tried:
            urls = ", ".join(self.replicas[i].url for i in tried)
            return _response(_error(502, f"replica {urls} could not be reached", "BadGateway"))
        return _response(_error(502, "no healthy replica: " + self._health_text(), "BadGateway"))

    def _health_text(self) -> str:
        return "; ".join(f"{r.url}: {r.why}" for r in self.replicas)

    # ---- completions and everything else

    async def _routed(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        hashes = self.router.hashes(*prompt_of(request.path, payload))
        tried: list[int] = []
        while eligible := [i for i in self._healthy() if i not in tried]:
            i, how = self.router.choose(hashes, {i: self.replicas[i].in_flight for i in eligible})
            # recorded now, not at the answer: TRL sends a prompt's G samples at once, and all but the first should
            # find it (a replica that cannot be reached is marked down, which forgets its blocks)
            self.router.record(hashes, i)
            replica = self.replicas[i]
            replica.in_flight += 1
            try:
                answer = await self._relay(request, i, body)
            finally:
                replica.in_flight -= 1
            if answer is not None:
                replica.requests += 1
                self.routes[how] += 1
                return answer
            tried.append(i)
        return self._nobody(tried)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        tried: list[int] = []
        while eligible := [i for i in self._healthy() if i not in tried]:
            i = self.router.least_loaded({i: self.replicas[i].in_flight for i in eligible})
            answer = await self._relay(request, i, body)
            if answer is not None:
                return answer
            tried.append(i)
        return self._nobody(tried)

    # ---- broadcasts

    async def _broadcast(self, request: web.Request) -> Answer:
        """/pause, /resume, /reset_prefix_cache to every healthy replica; the first refusal is the answer."""
        body, headers = await request.read(), _forwarded(request.headers)
        async with self._lock:
            targets = [self.replicas[i] for i in self._healthy()]
            answers = await asyncio.gather(
                *(self._call(r, request.method, request.path_qs, body, headers) for r in targets)
            )
            if request.path == "/pause":
                self.paused = "?" + request.query_string if request.query_string else ""
            elif request.path == "/resume":
                self.paused = None
            else:
                self.router.clear()
        reached = [a for a in answers if a is not None]
        if not reached:
            return _error(502, f"{request.path}: no replica could be reached: {self._health_text()}", "BadGateway")
        refused = [a for a in reached if a.status >= 300]
        return refused[0] if refused else reached[0]

    async def _load_one(
        self, replica: Replica, body: bytes, headers: dict[str, str], budget_s: float | None = None
    ) -> _Outcome:
        """POST the load to one replica; "No adapter found" (a lagging mount) is tried again with a growing wait
        until the retry budget (default: the settings') is spent."""
        started = time.monotonic()
        deadline = started + (self.settings.load_retry_s if budget_s is None else budget_s)
        wait, tries = FIRST_BACKOFF_S, 0
        name = _lora_name(body)
        while True:
            tries += 1
            answer = await self._call(replica, "POST", LOAD, body, headers)
            if answer is None:
                return _Outcome("gone", tries=tries)
            if answer.status == 200:
                replica.loads_ok += 1
                replica.last_load_s = round(time.monotonic() - started, 4)
                return _Outcome("ok", answer, tries)
            if not LAGGING.search(answer.body.decode(errors="replace")):
                replica.loads_failed += 1
                log.warning(
                    f"adapter load {name} refused by {replica.url}: HTTP {answer.status}: {_reason(answer.body)}"
                )
                return _Outcome("refused", answer, tries)
            left = deadline - time.monotonic()
            if left <= 0:
                replica.loads_failed += 1
                log.warning(
                    f"adapter load {name} on {replica.url}: still not found after {tries} tries over "
                    f"{time.monotonic() - started:.1f} s (a mount that lags?): {_reason(answer.body)}"
                )
                return _Outcome("lagging", answer, tries)
            replica.loads_retried += 1
            pause = min(wait, left)
            log.warning(
                f"adapter load {name} on {replica.url}: not found (try {tries}), trying again in "
                f"{pause:.2f} s: {_reason(answer.body)}"
            )
            await asyncio.sleep(pause)
            wait = min(wait * 2, MAX_BACKOFF_S)

    async def _load(self, request: web.Request) -> Answer:
        """All-or-nothing: every healthy replica loads the adapter, or those that did unload it again. A replica that
        cannot be reached is left out (marked down, it gets the adapter when it returns)."""
        body, headers = await request.read(), _forwarded(request.headers)
        name = _lora_name(body)
        async with self._lock:
            started = time.monotonic()
            targets = [self.replicas[i] for i in self._healthy()]
            tasks = {asyncio.create_task(self._load_one(r, body, headers)): r for r in targets}
            outcomes: dict[str, _Outcome] = {}
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    outcomes[tasks[task].url] = task.result()
                if any(o.kind == "refused" for o in outcomes.values()):
                    for task in pending:
                        task.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                    break
            kinds = {o.kind for o in outcomes.values()}
            failed = "refused" in kinds or "lagging" in kinds
            if failed:
                # accepted, or cut short (the replica may have taken it): unload there
                undo = [r for r in targets if outcomes.get(r.url, _Outcome("unknown")).kind in ("ok", "unknown")]
                await self._rollback(name, undo, headers)
                self.loads.failed += 1
            elif "ok" in kinds:
                self.adapters.pop(name, None)  # a name loaded again is the newest
                self.adapters[name] = _Adapter(body, {k: v for k, v in headers.items() if k.lower() == "authorization"})
                seconds = time.monotonic() - started
                self.loads.add(seconds)
                took = [r for r in targets if outcomes[r.url].kind == "ok"]
                missing = [r.url for r in self.replicas if r not in took]
                note = f"; not on {', '.join(missing)} (down: given it when it returns)" if missing else ""
                log.info(f"adapter {name} loaded on {len(took)}/{len(self.replicas)} replicas in {seconds:.2f} s{note}")
        refused = [o.answer for o in outcomes.values() if o.kind == "refused"]
        if refused:
            return refused[0]
        lagging = [(url, o) for url, o in outcomes.items() if o.kind == "lagging"]
        if lagging:
            url, o = lagging[0]
            return _error(
                504,
                f"replica {url}: adapter {name} still not found after {o.tries} tries over "
                f"{self.settings.load_retry_s:g} s (a mount that lags?): {_reason(o.answer.body)}",
                "GatewayTimeout",
            )
        ok = [o.answer for o in outcomes.values() if o.kind == "ok"]
        if not ok:
            return _error(502, f"adapter load {name}: no replica could be reached: {self._health_text()}", "BadGateway")
        return ok[0]

    async def _rollback(self, name: str, replicas: list[Replica], headers: dict[str, str]) -> None:
        body = json.dumps({"lora_name": name}).encode()
        answers = await asyncio.gather(*(self._call(r, "POST", UNLOAD, body, headers) for r in replicas))
        for replica, answer in zip(replicas, answers, strict=True):
            status = "unreachable" if answer is None else f"HTTP {answer.status}"
            log.warning(f"adapter load {name} rolled back on {replica.url} ({status})")

    async def _unload(self, request: web.Request) -> Answer:
        """To every healthy replica; a replica that does not hold the name (404) is not an error."""
        body, headers = await request.read(), _forwarded(request.headers)
        name = _lora_name(body)
        async with self._lock:
            targets = [self.replicas[i] for i in self._healthy()]
            answers = await asyncio.gather(*(self._call(r, "POST", UNLOAD, body, headers) for r in targets))
            self.adapters.pop(name, None)
        failed = [a for a in answers if a is not None and a.status >= 300 and a.status != 404]
        if failed:
            return failed[0]
        if not any(answers):
            return _error(502, f"unload {name}: no replica could be reached: {self._health_text()}", "BadGateway")
        return Answer(200, f"Success: LoRA adapter '{name}' removed from every replica.".encode(), "text/plain")

    async def _models(self, request: web.Request) -> Answer:
        """GET /v1/models of every healthy replica, merged by model id (first seen kept), each entry's replicas
        counted in `grpo_replicas`; the first error when none answers 200."""
        headers = _forwarded(request.headers)
        targets = [self.replicas[i] for i in self._healthy()]
        answers = await asyncio.gather(*(self._call(r, "GET", MODELS, b"", headers, HEALTH_TIMEOUT_S) for r in targets))
        merged: dict[str, dict] = {}
        good = 0
        for answer in answers:
            if answer is None or answer.status != 200:
                continue
            try:
                entries = json.loads(answer.body)["data"]
            except (ValueError, KeyError, TypeError):
                continue
            good += 1
            for entry in entries:
                if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                    merged.setdefault(entry["id"], {**entry, "grpo_replicas": 0})["grpo_replicas"] += 1
        if not good:
            failed = next((a for a in answers if a is not None), None)
            return failed or _error(502, f"GET {MODELS}: no replica answered: {self._health_text()}", "BadGateway")
        return Answer(200, json.dumps({"object": "list", "data": list(merged.values())}).encode(), "application/json")

    # ---- stats

    def stats(self) -> dict:
        routed = sum(self.routes.values())
        return {
            "routing": {
                "hits": self.routes["hit"],
                "misses": self.routes["miss"],
                "spills": self.routes["spill"],
                "affinity_share": round(self.routes["hit"] / routed, 4) if routed else None,
                "blocks_indexed": len(self.router.index),
            },
            "replicas": [
                {
                    "url": r.url,
                    "healthy": r.healthy,
                    "why": r.why,
                    "in_flight": r.in_flight,
                    "requests": r.requests,
                    "errors": r.errors,
                    "loads_ok": r.loads_ok,
                    "loads_failed": r.loads_failed,
                    "loads_retried": r.loads_retried,
                    "resyncs": r.resyncs,
                    "last_load_s": r.last_load_s,
                }
                for r in self.replicas
            ],
            "adapter_loads": {
                "ok": self.loads.count,
                "failed": self.loads.failed,
                "last_s": self.loads.last_s,
                "mean_s": self.loads.total_s / self.loads.count if self.loads.count else None,
                "max_s": self.loads.max_s if self.loads.count else None,
            },
            "adapters": list(self.adapters),
            "paused": self.paused is not None,
        }


def _lora_name(body: bytes) -> str:
    try:
        return str(json.loads(body).get("lora_name"))
    except (ValueError, AttributeError):
        return "?"


# ---------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage block
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


_HOST = re.compile(r"[A-Za-z0-9:][A-Za-z0-9.:_-]{0,252}")  # a name, an IPv4 or (without brackets) an IPv6 literal
_PRINTABLE_ASCII = re.compile(r"[!-~]{1,2048}")  # no spaces, control characters or non-ASCII look-alikes


def listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not _HOST.fullmatch(host) or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (ASCII name or address, port 1-65535)")
    return host, int(port)


def replica_url(text: str) -> str:
    if not _PRINTABLE_ASCII.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: printable ASCII only, no spaces")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL with a host")
    if not _HOST.fullmatch(parts.hostname):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the host is not a name or an IP address (letters, digits, . - _ :)"
        )
    if parts.username or parts.password:
        raise argparse.ArgumentTypeError(
            f"{parts.hostname}: credentials do not belong on a command line; "
            "the trainer's own Authorization header is passed on"
        )
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"{text!r}: give the server's base URL (no path or query)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
    return text.rstrip("/")


def _number(kind, low, high):
    def parse(text: str):
        try:
            if not _PRINTABLE_ASCII.fullmatch(text):  # int() and float() accept non-ASCII digits
                raise ValueError(text)
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value <= high:  # also refuses nan and infinities
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number, at least {low} and at most {high:g}")
        return value

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Settings()
    parser = _Parser(
        prog="python3 -m grpo_deploy.runtime.serving.proxy",
        description=__doc__,
        epilog="@FILE reads more arguments from FILE, one per line (# comments skipped): the kit's config/proxy.args.",
    )
    parser.add_argument(
        "--listen",
        type=listen_address,
        default=("127.0.0.1", 8000),
        metavar="HOST:PORT",
        help="where the trainer reaches the proxy (default 127.0.0.1:8000)",
    )
    parser.add_argument(
        "--replica",
        type=replica_url,
        action="append",
        required=True,
        metavar="URL",
        help="a vLLM server's base URL, e.g. http://10.0.0.2:8000 (repeat for each replica)",
    )
    parser.add_argument(
        "--block-size",
        type=_number(int, 1, 4096),
        default=d.block_size,
        help=f"tokens per prefix block (default {d.block_size}, vLLM's)",
    )
    parser.add_argument(
        "--imbalance",
        type=_number(int, 0, 100_000),
        default=d.imbalance,
        help=f"requests in flight beyond the least loaded replica before affinity gives way (default {d.imbalance})",
    )
    parser.add_argument(
        "--load-retry-s",
        type=_number(float, 0.0, 86_400.0),
        default=d.load_retry_s,
        help="how long an adapter load that finds no adapter (a mount that lags) is tried again "
        f"before the answer is 504 (default {d.load_retry_s:g})",
    )
    parser.add_argument(
        "--connect-timeout-s",
        type=_number(float, 0.01, 3_600.0),
        default=d.connect_timeout_s,
        help=f"connect timeout to a replica (default {d.connect_timeout_s:g})",
    )
    parser.add_argument(
        "--health-interval-s",
        type=_number(float, 0.01, 3_600.0),
        default=d.health_interval_s,
        help=f"seconds between health probes of each replica (default {d.health_interval_s:g})",
    )
    parser.add_argument(
        "--max-blocks",
        type=_number(int, 1, 100_000_000),
        default=d.max_blocks,
        help=f"prefix blocks remembered, least recently used dropped (default {d.max_blocks})",
    )
    args = parser.parse_args(_expanded(parser, sys.argv[1:] if argv is None else argv))
    if len(set(args.replica)) != len(args.replica):
        parser.error("--replica: the same URL is given twice")
    return args


def _expanded(parser: _Parser, argv: list[str]) -> list[str]:
    """*argv* with each @FILE replaced by its lines (one argument each; blank lines and # comments skipped), the file
    read bounded, no link followed (grpo_deploy.common.readback); not recursive."""
    out: list[str] = []
    for arg in argv:
        if not arg.startswith("@"):
            out.append(arg)
            continue
        try:
            text = read_text(arg[1:], ARGS_FILE_LIMIT, "the proxy's arguments file")
        except ReadRefused as refused:
            parser.error(str(refused))
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
        for n, line in enumerate(lines):  # options and their values only; a stray line is never echoed back
            if not line.startswith("--") and (n == 0 or not lines[n - 1].startswith("--")):
                parser.error(f"{arg[1:]}: not an arguments file (line {n + 1} of its arguments is neither an option "
                             "nor an option's value)")
        out += lines
    return out


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(
        block_size=args.block_size,
        imbalance=args.imbalance,
        load_retry_s=args.load_retry_s,
        connect_timeout_s=args.connect_timeout_s,
        health_interval_s=args.health_interval_s,
        max_blocks=args.max_blocks,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s replica-proxy %(levelname)s %(message)s")
    proxy = ReplicaProxy(args.replica, settings_of(args))
    host, port = args.listen
    log.info(f"listening on {host}:{port} for {len(args.replica)} replicas: {', '.join(args.replica)}")
    try:
        web.run_app(proxy.app(), host=host, port=port, access_log=None, print=None)
    except OSError as error:
        print(f"replica proxy: cannot listen on {host}:{port}: {error.strerror or error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
