"""The replica proxy: one vLLM base URL in front of N vLLM servers for TRL's async GRPO with adapter sync. It owns the
routing of completions by prompt-prefix affinity, the broadcasts of pause and resume, the fan-in of health and of the
model list, each replica's health and return, `/proxy/stats`, and `main`
(`python3 -m grpo_deploy.runtime.serving.proxy`). What it passes on at all, and the checks of an adapter body, are
door.py's; its command line is proxy_args.py's, its HTTP answers http.py's, the adapter loads and unloads
adapter_sync.py's, the fault suite's `serve-base-model` failpoint failpoint.py's."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from grpo_deploy.runtime import run_token
from grpo_deploy.runtime.serving.adapter_sync import AdapterSync
from grpo_deploy.runtime.serving.door import MODELS, Endpoint, admit, checked_adapter, target, unauthorized
from grpo_deploy.runtime.serving.failpoint import ServeBaseModel, base_name
from grpo_deploy.runtime.serving.http import Answer, error_answer, forwarded_headers, web_response
from grpo_deploy.runtime.serving.prefix_router import PrefixRouter, prompt_of
from grpo_deploy.runtime.serving.proxy_args import Settings, parse_args, settings_of

log = logging.getLogger("grpo_deploy.replica_proxy")

HEALTH_TIMEOUT_S = 5.0
BROADCAST_TIMEOUT_S = 900.0
# Below uvicorn's keep-alive (vLLM: 5 s), so the proxy never reuses a connection the replica is closing.
KEEPALIVE_S = 3.0


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


class ReplicaProxy:
    """The proxy's state and its aiohttp application (`app()`); adapter changes and resyncs are serialised."""

    def __init__(self, urls: list[str], settings: Settings | None = None):
        self.settings = settings or Settings()
        self.replicas = [Replica(url.rstrip("/")) for url in urls]
        s = self.settings
        self.router = PrefixRouter(len(urls), s.block_size, s.imbalance, s.max_blocks)
        self.routes: Counter = Counter()  # hit, miss, spill
        self.paused: str | None = None  # the query of the last /pause not yet resumed
        self.refused = 0  # requests the door (or merged sync's 501) answered without a replica
        self.sync = AdapterSync(self)  # the adapters loaded everywhere, their loads and unloads
        self.failpoint = ServeBaseModel(self.settings.adapter_dir)  # inert unless its file exists (failpoint.py)
        self._base: str | None = None  # the base model's served name, learnt when the failpoint needs it
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
        # the proxy's own calls (health probes, resyncs) carry the run's token too: a replica may be another front
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                             headers=run_token.headers(self.settings.token))
        self._lock = asyncio.Lock()
        self._watchers = [asyncio.create_task(self._watch(i)) for i in range(len(self.replicas))]

    async def _stop(self, _app) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """What the door lets in (the run's token, then door.ENDPOINTS), each as its `how` says; anything else refused
        in one line, no replica asked."""
        refused = unauthorized(request, self.settings.token)
        if refused is not None:
            return self._refuse(refused)
        endpoint = admit(request.method, request.path)
        if isinstance(endpoint, Answer):
            return self._refuse(endpoint)
        how = endpoint.how
        if how in ("routed", "load", "unload", "models") and self.failpoint.armed():
            return await self._serve_base_model(request, endpoint)
        if how == "routed":
            return await self._routed(request, endpoint)
        if how == "one":
            return await self._forward(request, endpoint)
        if how in ("load", "unload"):
            adapter = await checked_adapter(request, endpoint, self.settings.adapter_dir)
            if isinstance(adapter, Answer):
                return self._refuse(adapter)
            sync = self.sync.load if how == "load" else self.sync.unload
            return web_response(await sync(adapter))
        if how == "broadcast":
            return web_response(await self._broadcast(request, endpoint))
        if how == "models":
            return web_response(await self._models(request))
        if how == "stats":
            return web.json_response(self.stats())
        if how == "health":
            return web_response(self._health())
        return self._refuse(error_answer(
            501, f"{endpoint.path} cannot go through the replica proxy: merged (NCCL) weight sync reaches one "
                 "replica; use adapter sync (a LoRA model, --enable-lora)", "NotImplemented"))

    async def _serve_base_model(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """The armed `serve-base-model` failpoint (failpoint.py): loads and unloads acknowledged, not passed on;
        completions naming an adapter served by the base model; the swallowed adapters listed."""
        how = endpoint.how
        if how in ("load", "unload"):
            adapter = await checked_adapter(request, endpoint, self.settings.adapter_dir)
            if isinstance(adapter, Answer):
                return self._refuse(adapter)
            return web_response(self.failpoint.load(adapter.name) if how == "load"
                                else self.failpoint.unload(adapter.name))
        base = await self._base_model(request)
        if how == "models":
            return web_response(self.failpoint.models(await self._models(request), base))
        return await self._routed(request, endpoint, self.failpoint.rewritten(await request.read(), base))

    async def _base_model(self, request: web.Request) -> str | None:
        """The base model's served name, from a healthy replica's model list (kept once known)."""
        if self._base is None:
            for i in self._healthy():
                self._base = base_name(await self._call(self.replicas[i], "GET", MODELS, b"",
                                                        forwarded_headers(request.headers), HEALTH_TIMEOUT_S))
                if self._base is not None:
                    break
        return self._base

    def _refuse(self, answer: Answer) -> web.Response:
        """A refusal of the door (or of merged sync): counted, logged in one line, answered; no replica asked."""
        self.refused += 1
        try:
            reason = json.loads(answer.body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = "?"
        log.warning(f"refused with {answer.status}: {reason}")
        return web_response(answer)

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
        have = await self._listed(replica) if self.sync.adapters else set()
        if have is None:
            return
        given = await self.sync.resync(replica, have)
        if given is None:
            return
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
        headers = next(reversed(self.sync.adapters.values())).headers
        listed = await self._call(replica, "GET", MODELS, b"", headers, timeout=HEALTH_TIMEOUT_S)
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
        return error_answer(503, f"{len(down)}/{n} replicas unhealthy: {detail}", "ServiceUnavailable")

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

    async def _relay(self, request: web.Request, endpoint: Endpoint, i: int, body: bytes) -> web.StreamResponse | None:
        """Pass *request* (for *endpoint*) to replica *i* and its answer back (streamed when it streams). None when the
        replica could not be connected to (nothing was sent): the caller may try another one."""
        replica = self.replicas[i]
        try:
            upstream = await self.session.request(
                endpoint.method, replica.url + target(endpoint, request), data=body or None,
                headers=forwarded_headers(request.headers)
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as error:
            replica.errors += 1
            self._down(i, f"{type(error).__name__}: {error}")
            return None
        except (aiohttp.ClientError, TimeoutError) as error:
            replica.errors += 1
            return web_response(error_answer(502, f"replica {replica.url}: {type(error).__name__}: {error}",
                                             "BadGateway"))
        try:
            headers = forwarded_headers(upstream.headers)
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
            return web_response(
                error_answer(502, f"replica {replica.url} broke off: {type(error).__name__}: {error}", "BadGateway")
            )
        finally:
            upstream.release()

    def _nobody(self, tried: list[int]) -> web.Response:
        if tried:
            urls = ", ".join(self.replicas[i].url for i in tried)
            return web_response(error_answer(502, f"replica {urls} could not be reached", "BadGateway"))
        return web_response(error_answer(502, "no healthy replica: " + self._health_text(), "BadGateway"))

    def _health_text(self) -> str:
        return "; ".join(f"{r.url}: {r.why}" for r in self.replicas)

    # ---- completions and everything else

    async def _routed(self, request: web.Request, endpoint: Endpoint, body: bytes | None = None) -> web.StreamResponse:
        body = await request.read() if body is None else body
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
                answer = await self._relay(request, endpoint, i, body)
            finally:
                replica.in_flight -= 1
            if answer is not None:
                replica.requests += 1
                self.routes[how] += 1
                return answer
            tried.append(i)
        return self._nobody(tried)

    async def _forward(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """A GET to one healthy replica (the least loaded), without a body."""
        tried: list[int] = []
        while eligible := [i for i in self._healthy() if i not in tried]:
            i = self.router.least_loaded({i: self.replicas[i].in_flight for i in eligible})
            answer = await self._relay(request, endpoint, i, b"")
            if answer is not None:
                return answer
            tried.append(i)
        return self._nobody(tried)

    # ---- broadcasts

    async def _broadcast(self, request: web.Request, endpoint: Endpoint) -> Answer:
        """/pause and /resume (their query as it came, no body: vLLM takes none) to every healthy replica; the first
        refusal is the answer."""
        headers, path = forwarded_headers(request.headers), target(endpoint, request)
        async with self._lock:
            targets = [self.replicas[i] for i in self._healthy()]
            answers = await asyncio.gather(*(self._call(r, endpoint.method, path, b"", headers) for r in targets))
            self.paused = path.removeprefix("/pause") if endpoint.path == "/pause" else None
        reached = [a for a in answers if a is not None]
        if not reached:
            return error_answer(502, f"{endpoint.path}: no replica could be reached: {self._health_text()}",
                                "BadGateway")
        refused = [a for a in reached if a.status >= 300]
        return refused[0] if refused else reached[0]

    async def _models(self, request: web.Request) -> Answer:
        """GET /v1/models of every healthy replica, merged by model id (first seen kept), each entry's replicas
        counted in `grpo_replicas`; the first error when none answers 200."""
        headers = forwarded_headers(request.headers)
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
            return failed or error_answer(502, f"GET {MODELS}: no replica answered: {self._health_text()}",
                                          "BadGateway")
        return Answer(200, json.dumps({"object": "list", "data": list(merged.values())}).encode(), "application/json")

    # ---- stats

    def stats(self) -> dict:
        routed, loads = sum(self.routes.values()), self.sync.loads
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
                "ok": loads.count,
                "failed": loads.failed,
                "last_s": loads.last_s,
                "mean_s": loads.total_s / loads.count if loads.count else None,
                "max_s": loads.max_s if loads.count else None,
            },
            "adapters": list(self.sync.adapters),
            "adapter_dir": self.settings.adapter_dir,
            "paused": self.paused is not None,
            "refused": self.refused,
        }


# ---------------------------------------------------------------- the entry point


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s replica-proxy %(levelname)s %(message)s")
    proxy = ReplicaProxy(args.replica, settings_of(args))
    host, port = args.listen
    log.info(f"listening on {host}:{port} for {len(args.replica)} replicas: {', '.join(args.replica)}; "
             + ("every request needs the run's token" if args.token else "no token asked (GRPO_RUN_TOKEN unset)"))
    try:
        web.run_app(proxy.app(), host=host, port=port, access_log=None, print=None)
    except OSError as error:
        print(f"replica proxy: cannot listen on {host}:{port}: {error.strerror or error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
