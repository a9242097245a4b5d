"""The replica proxy against fake vLLM servers (real aiohttp servers on 127.0.0.1): prefix affinity, spread, adapter
namespaces, spills, pause/resume, health fan-in, dead and returning replicas, stats, and the command serving until
SIGTERM. Every wait is bounded. The adapter sync (on this file's rig) is tested in test_adapter_sync.py, the door (what
is passed on at all, the adapter bodies) in test_door.py, the arguments in test_proxy_args.py."""

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

from grpo_deploy.runtime.serving import proxy as rp
from grpo_deploy.runtime.serving.adapter_sync import LOAD, UNLOAD
from grpo_deploy.runtime.serving.door import MODELS, STATS
from grpo_deploy.runtime.serving.proxy_args import Settings
from tests.unit.runtime.fake_vllm import BASE, FakeVLLM
from tests.unit.runtime.serving.test_prefix_router import TEMPLATE, tokens

REPO = Path(__file__).resolve().parents[4]
ADAPTERS = "/adapters"  # the rig's adapter folder: not on this machine, so loads are checked as paths only
FAST = Settings(health_interval_s=0.05, connect_timeout_s=0.5, load_retry_s=1.0, adapter_dir=ADAPTERS)


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
        return await self.post(LOAD, {"lora_name": name, "lora_path": f"{ADAPTERS}/{name}", "load_inplace": False})

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


# ---------------------------------------------------------------- broadcasts (adapter loads: test_adapter_sync.py)


def test_pause_and_resume_reach_every_replica_with_their_query_and_no_body():
    async def scenario():
        async with rig(3) as r:
            await r.complete(tokens(1))
            for path in ("/pause?mode=keep", "/resume"):
                assert (await r.post(path, {"planted": 1}))[0] == 200
            for fake in r.fakes:
                calls = [(path, body) for m, path, body in fake.calls if m == "POST" and not path.startswith("/v1/")]
                assert calls == [("/pause?mode=keep", None), ("/resume", None)]

    run(scenario())


def test_weight_transfer_is_refused_not_forwarded():
    async def scenario():
        async with rig() as r:
            status, text = await r.post("/init_weight_transfer_engine", {"init_info": {}})
            assert status == 501 and "adapter sync" in text
            assert all("/init_weight_transfer_engine" not in f.paths() for f in r.fakes)

    run(scenario())


def test_server_info_goes_to_one_healthy_replica():
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
            status, text = await r.get(MODELS)
            listed = {e["id"]: e["grpo_replicas"] for e in json.loads(text)["data"]}
            assert status == 200 and listed == {BASE: 2, "trl-policy-v3": 1}
            assert all(MODELS in f.paths("GET") for f in r.fakes)
            status, _ = await r.post(UNLOAD, {"lora_name": "trl-policy-v3"})  # the sweep's unload reaches it
            assert status == 200 and "trl-policy-v3" not in r.fakes[1].adapters
            await r.fakes[0].stop()
            await until(lambda: not r.proxy.replicas[0].healthy, what="replica 0 marked down")
            status, text = await r.get(MODELS)
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


def test_stats_count_requests_per_replica():
    async def scenario():
        async with rig() as r:
            for seed in range(5):
                await r.complete(tokens(seed))
                await r.complete(tokens(seed))
            status, text = await r.get(STATS)
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
            "--adapter-dir",
            ADAPTERS,
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


def test_the_command_with_require_token_takes_it_from_the_environment_never_the_command_line(tmp_path):
    """A real proxy process as a front: its token only in its environment (not in /proc/<pid>/cmdline, what `ps`
    shows), 401 without it, through with it, and never in what it logs."""
    import os

    from grpo_deploy.runtime import run_token

    token = run_token.make()

    async def scenario():
        fake = await FakeVLLM().start()
        port = free_port()
        args_file = tmp_path / "front.args"
        args_file.write_text(f"--listen\n127.0.0.1:{port}\n--adapter-dir\n{ADAPTERS}\n--require-token\n")
        cmd = [sys.executable, "-m", "grpo_deploy.runtime.serving.proxy", f"@{args_file}", "--replica", fake.url,
               "--health-interval-s", "0.1"]
        env = {**os.environ, run_token.ENV: token}
        proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE, cwd=REPO, env=env)
        try:
            assert token.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            auth = run_token.headers(token)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
                deadline = time.monotonic() + 20
                while True:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with client.get(f"http://127.0.0.1:{port}/health", headers=auth) as response:
                            if response.status == 200:
                                break
                    assert time.monotonic() < deadline, "the proxy process never answered /health 200"
                    await asyncio.sleep(0.1)
                async with client.get(f"http://127.0.0.1:{port}/health") as response:
                    assert response.status == 401 and token not in await response.text()
                async with client.post(f"http://127.0.0.1:{port}/collective_rpc", headers=auth, json={}) as response:
                    assert response.status == 404
            assert [p for _, p, _ in fake.calls if p != "/health"] == []
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
            said = await proc.stderr.read()
            assert b"every request needs the run's token" in said and token.encode() not in said
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await fake.stop()

    run(scenario())
