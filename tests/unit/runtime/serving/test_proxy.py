"""The replica proxy against fake vLLM servers (real aiohttp servers on 127.0.0.1): prefix affinity, spread, adapter
namespaces, spills, broadcast loads (retried, 504, rolled back), pause/resume/reset, health fan-in, dead and returning
replicas, stats, and the command line. Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from grpo_deploy.runtime.serving import proxy as rp
from grpo_deploy.runtime.serving.adapter_sync import LOAD, UNLOAD
from grpo_deploy.runtime.serving.proxy_args import Settings, parse_args, settings_of
from tests.unit.runtime.fake_vllm import BASE, FakeVLLM
from tests.unit.runtime.serving.test_prefix_router import TEMPLATE, tokens

REPO = Path(__file__).resolve().parents[4]
FAST = Settings(health_interval_s=0.05, connect_timeout_s=0.5, load_retry_s=1.0)


def run(coro, seconds: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, seconds))


async def until(check, seconds: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {seconds} s")
        await asyncio.sleep(0.02)


class Rig:
    def __init__(self, fakes: list[FakeVLLM], proxy: rp.ReplicaProxy, url: str, client: aiohttp.ClientSession):
        self.fakes, self.proxy, self.url, self.client = fakes, proxy, url, client

    async def post(self, path: str, body: dict | None = None) -> tuple[int, str]:
        async with self.client.post(self.url + path, json=body) as response:
            return response.status, await response.text()

    async def get(self, path: str) -> tuple[int, str]:
        async with self.client.get(self.url + path) as response:
            return response.status, await response.text()

    async def complete(self, prompt, model: str = BASE) -> int:
        """The port of the fake that served it."""
        status, text = await self.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 2})
        assert status == 200, text
        return json.loads(text)["served_by"]

    async def load(self, name: str) -> tuple[int, str]:
        return await self.post(LOAD, {"lora_name": name, "lora_path": f"/adapters/{name}", "load_inplace": False})

    def index(self, port: int) -> int:
        return [f.port for f in self.fakes].index(port)


@contextlib.asynccontextmanager
async def rig(n: int = 2, settings: Settings = FAST, fakes: list[FakeVLLM] | None = None, ready: bool = True):
    fakes = fakes or [await FakeVLLM().start() for _ in range(n)]
    proxy = rp.ReplicaProxy([f.url for f in fakes], settings)
    runner = aiohttp.web.AppRunner(proxy.app(), access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as client:
        if ready:
            await until(lambda: all(r.healthy for r in proxy.replicas), what="every replica healthy")
        try:
            yield Rig(fakes, proxy, url, client)
        finally:
            await runner.cleanup()
            for fake in fakes:
                if fake.runner is not None:
                    await fake.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- routing through the proxy


def test_the_same_prefix_goes_to_the_same_replica():
    async def scenario():
        async with rig() as r:
            for seed in range(6):
                served = {await r.complete(tokens(seed)) for _ in range(4)}
                assert len(served) == 1, f"prompt {seed} went to {served}"
            routing = r.proxy.stats()["routing"]
            assert (routing["hits"], routing["misses"], routing["spills"]) == (18, 6, 0)

    run(scenario())


def test_different_prefixes_spread_over_the_replicas():
    async def scenario():
        async with rig(3) as r:
            served = [r.index(await r.complete(tokens(seed))) for seed in range(12)]
            assert sorted(served.count(i) for i in range(3)) == [4, 4, 4]

    run(scenario())


def test_a_shared_template_is_not_affinity():
    async def scenario():
        async with rig() as r:
            first = [await r.complete(tokens(seed, 2, TEMPLATE)) for seed in range(12)]
            assert min(first.count(f.port) for f in r.fakes) >= 4, first
            again = [await r.complete(tokens(seed, 2, TEMPLATE)) for seed in range(12)]
            assert again == first

    run(scenario())


def test_a_new_adapter_version_does_not_reuse_the_old_ones_blocks():
    async def scenario():
        async with rig() as r:
            for name in ("trl-policy-v1", "trl-policy-v2"):
                assert (await r.load(name))[0] == 200
            await r.complete(tokens(5), "trl-policy-v1")
            await r.complete(tokens(5), "trl-policy-v1")
            before = r.proxy.stats()["routing"]
            await r.complete(tokens(5), "trl-policy-v2")
            after = r.proxy.stats()["routing"]
            assert (before["hits"], before["misses"]) == (1, 1)
            assert (after["hits"], after["misses"]) == (1, 2)

    run(scenario())


def test_a_group_sent_at_once_goes_to_one_replica():
    async def scenario():
        async with rig() as r:
            hold = asyncio.Event()
            for fake in r.fakes:
                fake.hold = hold
            group = [asyncio.create_task(r.complete(tokens(7))) for _ in range(8)]  # TRL's G samples of one prompt
            await until(lambda: sum(x.in_flight for x in r.proxy.replicas) == 8, what="the group in flight")
            hold.set()
            assert len(set(await asyncio.gather(*group))) == 1
            routing = r.proxy.stats()["routing"]
            assert (routing["hits"], routing["misses"]) == (7, 1)

    run(scenario())


def test_a_replica_too_far_ahead_spills_to_the_least_loaded():
    async def scenario():
        async with rig() as r:
            home = await r.complete(tokens(1))
            busy = r.fakes[r.index(home)]
            busy.hold = asyncio.Event()
            held = [asyncio.create_task(r.complete(tokens(1))) for _ in range(9)]
            await until(lambda: r.proxy.replicas[r.index(home)].in_flight == 9, what="9 in flight")
            spilled = await r.complete(tokens(1))
            assert spilled != home
            busy.hold.set()
            assert set(await asyncio.gather(*held)) == {home}
            routing = r.proxy.stats()["routing"]
            assert (routing["hits"], routing["spills"], routing["misses"]) == (9, 1, 1)

    run(scenario())


def test_chat_completions_are_routed_by_their_messages():
    async def scenario():
        async with rig() as r:
            messages = [{"role": "system", "content": "x" * 200}, {"role": "user", "content": "y" * 300}]
            ports = set()
            for _ in range(3):
                status, text = await r.post("/v1/chat/completions", {"model": BASE, "messages": messages})
                assert status == 200, text
                ports.add(json.loads(text)["served_by"])
            assert len(ports) == 1
            assert r.proxy.stats()["routing"]["hits"] == 2

    run(scenario())


def test_a_streamed_completion_is_relayed_as_it_streams():
    async def scenario():
        async with rig() as r:
            for fake in r.fakes:
                fake.gate = asyncio.Event()
            body = {"model": BASE, "prompt": tokens(1), "stream": True}
            async with r.client.post(r.url + "/v1/completions", json=body) as response:
                assert response.status == 200 and response.content_type == "text/event-stream"
                try:
                    first = await asyncio.wait_for(response.content.readline(), 5)
                finally:
                    for fake in r.fakes:
                        fake.gate.set()
                events = [first] + [line async for line in response.content if line.strip()]
            assert [json.loads(e[6:])["choices"][0]["text"] for e in events[:2]] == ["o", "k"]
            assert events[-1].strip() == b"data: [DONE]"
            assert all(x["in_flight"] == 0 for x in r.proxy.stats()["replicas"])

    run(scenario())


# ---------------------------------------------------------------- adapter loads and broadcasts


def test_a_load_reaches_every_replica_and_is_counted():
    async def scenario():
        async with rig(3) as r:
            status, text = await r.load("trl-policy-v1")
            assert status == 200, text
            assert all(f.adapters == {"trl-policy-v1": "/adapters/trl-policy-v1"} for f in r.fakes)
            stats = r.proxy.stats()
            assert stats["adapters"] == ["trl-policy-v1"]
            assert stats["adapter_loads"]["ok"] == 1 and stats["adapter_loads"]["last_s"] is not None
            assert [x["loads_ok"] for x in stats["replicas"]] == [1, 1, 1]

    run(scenario())


def test_a_lagging_mount_is_retried_until_the_adapter_appears(caplog):
    async def scenario():
        async with rig() as r:
            r.fakes[1].lag = 2
            status, text = await r.load("trl-policy-v1")
            assert status == 200, text
            assert r.fakes[1].paths().count(LOAD) == 3 and r.fakes[0].paths().count(LOAD) == 1
            replicas = r.proxy.stats()["replicas"]
            assert [x["loads_retried"] for x in replicas] == [0, 2]
            assert replicas[1]["last_load_s"] >= 0.25 + 0.5  # its two waits
            assert replicas[0]["last_load_s"] is not None

    run(scenario())
    retried = [rec.message for rec in caplog.records if "not found (try" in rec.message]
    assert len(retried) == 2 and all("No adapter found" in m for m in retried)


def test_a_mount_that_never_shows_the_adapter_answers_504_not_404_and_rolls_back():
    async def scenario():
        async with rig(settings=Settings(health_interval_s=0.05, load_retry_s=0.6)) as r:
            r.fakes[1].lag = 10_000
            started = time.monotonic()
            status, text = await r.load("trl-policy-v1")
            assert status == 504, text
            assert time.monotonic() - started < 5
            assert "No adapter found" in json.loads(text)["error"]["message"]  # the kit's storage check reads it
            assert r.fakes[0].adapters == {} and UNLOAD in r.fakes[0].paths()
            assert r.proxy.stats()["adapters"] == [] and r.proxy.stats()["adapter_loads"]["failed"] == 1

    run(scenario())


def test_runtime_lora_off_is_passed_through_as_404_without_retries():
    async def scenario():
        async with rig() as r:
            r.fakes[1].runtime_lora = False
            status, text = await r.load("trl-policy-v1")
            assert status == 404 and json.loads(text) == {"detail": "Not Found"}
            assert r.fakes[1].paths().count(LOAD) == 1
            assert r.fakes[0].adapters == {}

    run(scenario())


def test_a_load_is_all_or_nothing(caplog):
    async def scenario():
        async with rig(3) as r:
            r.fakes[2].refuse = (400, "LoRA rank 64 is greater than max_lora_rank 16.")
            status, text = await r.load("trl-policy-v1")
            assert status == 400 and "max_lora_rank" in text
            assert [f.adapters for f in r.fakes] == [{}, {}, {}]
            assert all(UNLOAD in f.paths() for f in r.fakes[:2]) and UNLOAD not in r.fakes[2].paths()
            assert r.proxy.stats()["adapters"] == []
            assert [x["loads_failed"] for x in r.proxy.stats()["replicas"]] == [0, 0, 1]

    run(scenario())
    assert len([rec for rec in caplog.records if "refused by" in rec.message]) == 1


def test_a_refusal_does_not_wait_for_a_lagging_replica():
    async def scenario():
        async with rig(settings=Settings(health_interval_s=0.05, load_retry_s=20)) as r:
            r.fakes[0].lag = 10_000
            r.fakes[1].refuse = (500, "vLLM does not yet support DoRA.")
            started = time.monotonic()
            status, _ = await r.load("trl-policy-v1")
            assert status == 500 and time.monotonic() - started < 5

    run(scenario())


def test_unload_reaches_every_replica_and_a_missing_name_is_no_error():
    async def scenario():
        async with rig() as r:
            await r.load("trl-policy-v1")
            r.fakes[1].adapters.clear()
            status, _ = await r.post(UNLOAD, {"lora_name": "trl-policy-v1"})
            assert status == 200
            assert all(UNLOAD in f.paths() for f in r.fakes) and r.fakes[0].adapters == {}
            assert r.proxy.stats()["adapters"] == []

    run(scenario())


def test_pause_resume_and_prefix_cache_reset_reach_every_replica():
    async def scenario():
        async with rig(3) as r:
            await r.complete(tokens(1))
            for path in ("/pause?mode=keep", "/resume", "/reset_prefix_cache"):
                assert (await r.post(path))[0] == 200
            for fake in r.fakes:
                assert [p for p in fake.paths() if not p.startswith("/v1/")] == [
                    "/pause?mode=keep",
                    "/resume",
                    "/reset_prefix_cache",
                ]
            assert r.proxy.stats()["routing"]["blocks_indexed"] == 0

    run(scenario())


def test_weight_transfer_is_refused_not_forwarded():
    async def scenario():
        async with rig() as r:
            status, text = await r.post("/init_weight_transfer_engine", {"init_info": {}})
            assert status == 501 and "adapter sync" in text
            assert all("/init_weight_transfer_engine" not in f.paths() for f in r.fakes)

    run(scenario())


def test_everything_else_goes_to_one_healthy_replica():
    async def scenario():
        async with rig() as r:
            status, text = await r.get("/server_info?config_format=json")
            assert status == 200 and json.loads(text)["vllm_config"]["parallel_config"]["data_parallel_size"] == 1
            asked = [f for f in r.fakes if "/server_info?config_format=json" in f.paths("GET")]
            assert len(asked) == 1

    run(scenario())


def test_models_are_the_union_of_the_replicas_so_a_stale_sweep_sees_every_adapter():
    async def scenario():
        async with rig() as r:
            r.fakes[1].adapters["trl-policy-v3"] = "/adapters/trl-policy-v3"  # left on one replica by a dead run
            status, text = await r.get(rp.MODELS)
            listed = {e["id"]: e["grpo_replicas"] for e in json.loads(text)["data"]}
            assert status == 200 and listed == {BASE: 2, "trl-policy-v3": 1}
            assert all(rp.MODELS in f.paths("GET") for f in r.fakes)
            status, _ = await r.post(UNLOAD, {"lora_name": "trl-policy-v3"})  # the sweep's unload reaches it
            assert status == 200 and "trl-policy-v3" not in r.fakes[1].adapters
            await r.fakes[0].stop()
            await until(lambda: not r.proxy.replicas[0].healthy, what="replica 0 marked down")
            status, text = await r.get(rp.MODELS)
            assert status == 200 and [e["id"] for e in json.loads(text)["data"]] == [BASE]

    run(scenario())


# ---------------------------------------------------------------- health, dead and returning replicas


def test_health_is_true_only_when_every_replica_is():
    async def scenario():
        async with rig() as r:
            assert (await r.get("/health"))[0] == 200
            r.fakes[1].healthy = False
            await until(lambda: not r.proxy.replicas[1].healthy, what="replica 1 marked down")
            status, text = await r.get("/health")
            assert status == 503 and "1/2 replicas unhealthy" in text and r.fakes[1].url in text
            served = {await r.complete(tokens(seed)) for seed in range(6)}
            assert served == {r.fakes[0].port}
            r.fakes[1].healthy = True
            await until(lambda: r.proxy.replicas[1].healthy, what="replica 1 back")
            assert (await r.get("/health"))[0] == 200

    run(scenario())


def test_a_dead_replica_answers_502_quickly_not_a_hang():
    async def scenario():
        dead = FakeVLLM(free_port())  # never started: nothing listens there
        async with rig(fakes=[dead], ready=False) as r:
            r.proxy.replicas[0].healthy = True  # as if it died after its last good probe
            started = time.monotonic()
            status, text = await r.post("/v1/completions", {"model": BASE, "prompt": tokens(1)})
            assert status == 502 and dead.url in text
            status, _ = await r.post("/v1/completions", {"model": BASE, "prompt": tokens(1)})
            assert status == 502
            assert (await r.get("/health"))[0] == 503
            assert (await r.load("trl-policy-v1"))[0] == 502
            assert (await r.post(UNLOAD, {"lora_name": "trl-policy-v1"}))[0] == 502
            assert time.monotonic() - started < 3

    run(scenario())


def test_a_replica_that_never_accepts_the_connection_answers_502_within_the_connect_timeout():
    async def scenario():
        with contextlib.ExitStack() as stack:
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", 0))
            listener.listen(0)  # never accepted: once the queue is full, further connects hang (a black hole)
            port = listener.getsockname()[1]
            for _ in range(3):
                filler = stack.enter_context(socket.socket())
                filler.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    filler.connect(("127.0.0.1", port))
            async with rig(fakes=[FakeVLLM(port)], ready=False) as r:
                r.proxy.replicas[0].healthy = True
                started = time.monotonic()
                status, _ = await r.post("/v1/completions", {"model": BASE, "prompt": tokens(1)})
                assert status == 502
                assert time.monotonic() - started < FAST.connect_timeout_s + 2
                assert not r.proxy.replicas[0].healthy

    run(scenario())


def test_requests_fail_over_when_a_replica_dies():
    async def scenario():
        async with rig() as r:
            await r.fakes[1].stop()
            r.fakes[1].runner = None
            served = [await r.complete(tokens(seed)) for seed in range(6)]
            assert set(served) == {r.fakes[0].port}
            assert not r.proxy.replicas[1].healthy

    run(scenario())


def test_a_returning_replica_gets_the_adapters_and_the_pause_before_it_is_routed_to():
    async def scenario():
        async with rig() as r:
            assert (await r.load("trl-policy-v1"))[0] == 200
            port = r.fakes[1].port
            await r.fakes[1].stop()
            await until(lambda: not r.proxy.replicas[1].healthy, what="replica 1 marked down")
            assert (await r.post("/pause?mode=keep"))[0] == 200
            assert (await r.load("trl-policy-v2"))[0] == 200  # the one live replica took it
            back = r.fakes[1] = await FakeVLLM(port).start()
            await until(lambda: r.proxy.replicas[1].healthy, what="replica 1 resynced")
            loads = [body["lora_name"] for m, path, body in back.calls if path == LOAD]
            assert loads == ["trl-policy-v1", "trl-policy-v2"] and back.paused
            assert (await r.post("/resume"))[0] == 200
            served = [await r.complete(tokens(seed), "trl-policy-v2") for seed in range(8)]
            assert served.count(port) >= 3
            assert r.proxy.stats()["replicas"][1]["resyncs"] == 2  # the first start, the return

    run(scenario())


def test_a_replica_that_only_blinked_keeps_its_adapters_and_is_not_given_them_twice():
    async def scenario():
        async with rig() as r:
            assert (await r.load("trl-policy-v1"))[0] == 200
            r.fakes[1].healthy = False
            await until(lambda: not r.proxy.replicas[1].healthy, what="replica 1 marked down")
            r.fakes[1].healthy = True
            await until(lambda: r.proxy.replicas[1].healthy, what="replica 1 back")
            assert r.fakes[1].paths().count(LOAD) == 1 and "/v1/models" in r.fakes[1].paths("GET")

    run(scenario())


def test_a_replica_that_cannot_take_the_adapter_back_stays_out():
    async def scenario():
        async with rig() as r:
            assert (await r.load("trl-policy-v1"))[0] == 200
            port = r.fakes[1].port
            await r.fakes[1].stop()
            await until(lambda: not r.proxy.replicas[1].healthy, what="replica 1 marked down")
            back = FakeVLLM(port)
            back.refuse = (500, "disk full")
            r.fakes[1] = await back.start()
            await until(lambda: LOAD in back.paths(), what="a resync attempt")
            await asyncio.sleep(0.2)
            assert not r.proxy.replicas[1].healthy and "resync" in r.proxy.replicas[1].why
            assert {await r.complete(tokens(seed), "trl-policy-v1") for seed in range(4)} == {r.fakes[0].port}

    run(scenario())


def test_a_returning_replica_that_cannot_see_the_adapter_yet_does_not_hold_up_the_others():
    async def scenario():
        async with rig(settings=Settings(health_interval_s=0.05, load_retry_s=30)) as r:
            assert (await r.load("trl-policy-v1"))[0] == 200
            port = r.fakes[1].port
            await r.fakes[1].stop()
            await until(lambda: not r.proxy.replicas[1].healthy, what="replica 1 marked down")
            back = FakeVLLM(port)
            back.lag = 10_000
            r.fakes[1] = await back.start()
            await until(lambda: back.paths().count(LOAD) >= 2, what="two resync attempts")
            started = time.monotonic()
            assert (await r.post("/pause?mode=keep"))[0] == 200
            assert time.monotonic() - started < 2
            assert not r.proxy.replicas[1].healthy
            back.lag = 0
            await until(lambda: r.proxy.replicas[1].healthy, what="replica 1 resynced once the adapter shows")
            assert back.adapters == {"trl-policy-v1": "/adapters/trl-policy-v1"} and back.paused

    run(scenario())


def test_stats_count_requests_per_replica():
    async def scenario():
        async with rig() as r:
            for seed in range(5):
                await r.complete(tokens(seed))
                await r.complete(tokens(seed))
            status, text = await r.get(rp.STATS)
            stats = json.loads(text)
            assert status == 200
            assert sum(x["requests"] for x in stats["replicas"]) == 10
            assert [x["requests"] for x in stats["replicas"]] == [len(f.completions()) for f in r.fakes]
            assert all(x["in_flight"] == 0 and x["healthy"] for x in stats["replicas"])
            assert stats["routing"]["affinity_share"] == 0.5

    run(scenario())


def test_the_command_serves_and_stops_on_sigterm():
    async def scenario():
        fake = await FakeVLLM().start()
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "grpo_deploy.runtime.serving.proxy",
            "--listen",
            f"127.0.0.1:{port}",
            "--replica",
            fake.url,
            "--health-interval-s",
            "0.1",
        ]
        proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE, cwd=REPO)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
                deadline = time.monotonic() + 20
                while True:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with client.get(f"http://127.0.0.1:{port}/health") as response:
                            if response.status == 200:
                                break
                    assert time.monotonic() < deadline, "the proxy process never answered /health 200"
                    await asyncio.sleep(0.1)
                payload = {"model": BASE, "prompt": tokens(1)}
                async with client.post(f"http://127.0.0.1:{port}/v1/completions", json=payload) as response:
                    assert response.status == 200 and (await response.json())["served_by"] == fake.port
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
            assert b"listening on 127.0.0.1" in await proc.stderr.read()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await fake.stop()

    run(scenario(), 60)


# ---------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "argv, says",
    [
        ([], "--replica"),
        (["--replica", "ftp://a:1"], "not an http"),
        (["--replica", "http://user:secret@a:1"], "credentials"),
        (["--replica", "http://a:1/v1"], "base URL"),
        (["--replica", "http://a:99999"], "--replica"),
        (["--replica", "http://a:1", "--replica", "http://a:1"], "twice"),
        (["--replica", "http://a:1", "--listen", "8000"], "HOST:PORT"),
        (["--replica", "http://a:1", "--block-size", "0"], "at least 1"),
        (["--replica", "http://a:1", "--imbalance", "x"], "not a number"),
        (["--replica", "http://a:1", "--load-retry-s", "nan"], "finite"),
        (["--replica", "http://a:1", "--load-retry-s", "inf"], "finite"),
        # hostile values: a newline, non-ASCII digits (int() takes them), a leading '-', a space, '$'
        (["--replica", "http://a:1", "--listen", "a\nb:1"], "HOST:PORT"),
        (["--replica", "http://a:1", "--listen", "127.0.0.1:\uff18\uff10"], "HOST:PORT"),
        (["--replica", "http://a:1", "--listen=-x:80"], "HOST:PORT"),
        (["--replica", "http://a:1", "--listen", "$HOST:80"], "HOST:PORT"),
        (["--replica", "http://a:\uff18\uff10"], "printable ASCII"),
        (["--replica", "http://a b:1"], "printable ASCII"),
        (["--replica", "http://a$b:1"], "not a name or an IP address"),
        (["--replica", "http://a:1", "--block-size", "\uff18"], "not a number"),
        (["--replica", "http://a:1", "--imbalance", "1" + "0" * 22], "at most"),
        (["--replica", "http://a:1", "--load-retry-s", "1e300"], "at most"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        rp.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err and "secret" not in err


def test_arguments_come_from_a_file_bounded_and_never_through_a_link(tmp_path, capsys):
    args = tmp_path / "proxy.args"
    args.write_text("# the kit's render\n--listen\n0.0.0.0:8000\n\n--replica\nhttp://server:8000\n")
    parsed = parse_args([f"@{args}", "--replica", "http://server-2:8000"])
    assert parsed.listen == ("0.0.0.0", 8000) and parsed.replica == ["http://server:8000", "http://server-2:8000"]
    link = tmp_path / "link.args"
    link.symlink_to(args)
    huge = tmp_path / "huge.args"
    huge.write_text("--replica\n" * 20_000)
    secret = tmp_path / "shadow"
    secret.write_text("root:$y$j9T$planted-hash-value:19000:0:99999:7:::\n")
    for bad, says in ((link, "symbolic link"), (huge, "at most 65536 bytes"), (tmp_path / "none", "no such file"),
                      (secret, "not an arguments file")):
        with pytest.raises(SystemExit) as stop:
            parse_args([f"@{bad}"])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and says in err and err.count("\n") == 1 and "planted" not in err, err


def test_good_arguments_become_settings():
    args = parse_args(
        [
            "--listen",
            "[::1]:9000",
            "--replica",
            "http://a:1/",
            "--replica",
            "https://b:2",
            "--block-size",
            "32",
            "--imbalance",
            "0",
            "--load-retry-s",
            "5",
        ]
    )
    assert args.listen == ("::1", 9000) and args.replica == ["http://a:1", "https://b:2"]
    settings = settings_of(args)
    assert (settings.block_size, settings.imbalance, settings.load_retry_s) == (32, 0, 5.0)
