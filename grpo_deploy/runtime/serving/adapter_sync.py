"""The replica proxy's adapter sync: a LoRA load broadcast to every healthy replica all-or-nothing (a load that
finds no adapter yet, a mount that lags, tried again with a growing wait; a refusal rolled back where it was taken),
an unload to every replica, the adapters loaded everywhere (oldest first) with the load timings, and the resync of a
replica that comes back. A helper the proxy holds (`ReplicaProxy.sync`)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass

from grpo_deploy.runtime.serving.door import LOAD, UNLOAD, Adapter
from grpo_deploy.runtime.serving.http import Answer, error_answer, reason_of
from grpo_deploy.runtime.storage.faults import ADAPTER_NOT_FOUND

log = logging.getLogger("grpo_deploy.replica_proxy")

# vLLM's answer when the adapter folder is not (yet) visible to the server: a mount that lags. FastAPI's own 404
# {"detail": "Not Found"} (runtime LoRA updating off) does not match and is passed through: TRL words that one.
LAGGING = re.compile(ADAPTER_NOT_FOUND, re.I)
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.25, 4.0


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
class _Load:
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    last_s: float | None = None
    failed: int = 0

    def add(self, seconds: float) -> None:
        self.count, self.total_s, self.last_s = self.count + 1, self.total_s + seconds, seconds
        self.max_s = max(self.max_s, seconds)


class AdapterSync:
    """The adapters of a ReplicaProxy (*proxy*): it reaches the replicas through the proxy's one call (`_call`, which
    marks a replica it cannot reach down), among the proxy's healthy replicas, under the proxy's lock (adapter changes
    and resyncs are serialised); a *replica* here is the proxy's Replica record."""

    def __init__(self, proxy):
        self.proxy = proxy
        self.adapters: OrderedDict[str, _Adapter] = OrderedDict()  # loaded everywhere, oldest first
        self.loads = _Load()

    async def resync(self, replica, have: set[str]) -> list[str] | None:
        """Give a replica that answers again every adapter it lacks (not in *have*), oldest first: the names given,
        or None when one failed (the replica's `why` says which). Called under the proxy's lock."""
        given = []
        for name, adapter in self.adapters.items():
            if name in have:
                continue
            # one try: a replica that cannot see the adapter yet must not hold every broadcast for the retry
            # budget; the next probe tries again
            outcome = await self.load_one(replica, adapter.body, adapter.headers, budget_s=0)
            if outcome.kind != "ok":
                replica.why = f"resync of adapter {name} failed ({outcome.kind})"
                return None
            given.append(name)
        return given

    async def load_one(self, replica, body: bytes, headers: dict[str, str], budget_s: float | None = None) -> _Outcome:
        """POST the load to one replica; "No adapter found" (a lagging mount) is tried again with a growing wait
        until the retry budget (default: the settings') is spent."""
        started = time.monotonic()
        deadline = started + (self.proxy.settings.load_retry_s if budget_s is None else budget_s)
        wait, tries = FIRST_BACKOFF_S, 0
        name = _lora_name(body)
        while True:
            tries += 1
            answer = await self.proxy._call(replica, "POST", LOAD, body, headers)
            if answer is None:
                return _Outcome("gone", tries=tries)
            if answer.status == 200:
                replica.loads_ok += 1
                replica.last_load_s = round(time.monotonic() - started, 4)
                return _Outcome("ok", answer, tries)
            if not LAGGING.search(answer.body.decode(errors="replace")):
                replica.loads_failed += 1
                log.warning(
                    f"adapter load {name} refused by {replica.url}: HTTP {answer.status}: {reason_of(answer.body)}"
                )
                return _Outcome("refused", answer, tries)
            left = deadline - time.monotonic()
            if left <= 0:
                replica.loads_failed += 1
                log.warning(
                    f"adapter load {name} on {replica.url}: still not found after {tries} tries over "
                    f"{time.monotonic() - started:.1f} s (a mount that lags?): {reason_of(answer.body)}"
                )
                return _Outcome("lagging", answer, tries)
            replica.loads_retried += 1
            pause = min(wait, left)
            log.warning(
                f"adapter load {name} on {replica.url}: not found (try {tries}), trying again in "
                f"{pause:.2f} s: {reason_of(answer.body)}"
            )
            await asyncio.sleep(pause)
            wait = min(wait * 2, MAX_BACKOFF_S)

    async def load(self, adapter: Adapter) -> Answer:
        """All-or-nothing: every healthy replica loads the adapter (a load the door checked), or those that did unload
        it again. A replica that cannot be reached is left out (marked down, it gets the adapter when it returns)."""
        body, headers, name = adapter.body, adapter.headers, adapter.name
        async with self.proxy._lock:
            started = time.monotonic()
            targets = [self.proxy.replicas[i] for i in self.proxy._healthy()]
            tasks = {asyncio.create_task(self.load_one(r, body, headers)): r for r in targets}
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
                self.adapters[name] = _Adapter(body, headers)
                seconds = time.monotonic() - started
                self.loads.add(seconds)
                took = [r for r in targets if outcomes[r.url].kind == "ok"]
                missing = [r.url for r in self.proxy.replicas if r not in took]
                note = f"; not on {', '.join(missing)} (down: given it when it returns)" if missing else ""
                log.info(f"adapter {name} loaded on {len(took)}/{len(self.proxy.replicas)} replicas in {seconds:.2f} s"
                         f"{note}")
        refused = [o.answer for o in outcomes.values() if o.kind == "refused"]
        if refused:
            return refused[0]
        lagging = [(url, o) for url, o in outcomes.items() if o.kind == "lagging"]
        if lagging:
            url, o = lagging[0]
            return error_answer(
                504,
                f"replica {url}: adapter {name} still not found after {o.tries} tries over "
                f"{self.proxy.settings.load_retry_s:g} s (a mount that lags?): {reason_of(o.answer.body)}",
                "GatewayTimeout",
            )
        ok = [o.answer for o in outcomes.values() if o.kind == "ok"]
        if not ok:
            return error_answer(502, f"adapter load {name}: no replica could be reached: {self.proxy._health_text()}",
                          "BadGateway")
        return ok[0]

    async def _rollback(self, name: str, replicas: list, headers: dict[str, str]) -> None:
        body = json.dumps({"lora_name": name}).encode()
        answers = await asyncio.gather(*(self.proxy._call(r, "POST", UNLOAD, body, headers) for r in replicas))
        for replica, answer in zip(replicas, answers, strict=True):
            status = "unreachable" if answer is None else f"HTTP {answer.status}"
            log.warning(f"adapter load {name} rolled back on {replica.url} ({status})")

    async def unload(self, adapter: Adapter) -> Answer:
        """To every healthy replica (an unload the door checked); a replica that does not hold the name (404) is not
        an error."""
        body, headers, name = adapter.body, adapter.headers, adapter.name
        async with self.proxy._lock:
            targets = [self.proxy.replicas[i] for i in self.proxy._healthy()]
            answers = await asyncio.gather(*(self.proxy._call(r, "POST", UNLOAD, body, headers) for r in targets))
            self.adapters.pop(name, None)
        failed = [a for a in answers if a is not None and a.status >= 300 and a.status != 404]
        if failed:
            return failed[0]
        if not any(answers):
            return error_answer(502, f"unload {name}: no replica could be reached: {self.proxy._health_text()}",
                                "BadGateway")
        return Answer(200, f"Success: LoRA adapter '{name}' removed from every replica.".encode(), "text/plain")


def _lora_name(body: bytes) -> str:
    try:
        return str(json.loads(body).get("lora_name"))
    except (ValueError, AttributeError):
        return "?"
