"""The replica proxy's adapter sync (runtime/serving/adapter_sync.py) through a proxy in front of fake vLLM servers
(real aiohttp servers on 127.0.0.1): a load broadcast to every replica all-or-nothing (a lagging mount retried, 504,
rolled back), an unload to every replica, and the resync of a replica that comes back. Every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import time

from grpo_deploy.runtime.serving.adapter_sync import LOAD, UNLOAD
from grpo_deploy.runtime.serving.proxy_args import Settings
from tests.unit.runtime.fake_vllm import FakeVLLM
from tests.unit.runtime.serving.test_prefix_router import tokens
from tests.unit.runtime.serving.test_proxy import ADAPTERS, rig, run, until


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
        async with rig(settings=Settings(health_interval_s=0.05, load_retry_s=0.6, adapter_dir=ADAPTERS)) as r:
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
        async with rig(settings=Settings(health_interval_s=0.05, load_retry_s=20, adapter_dir=ADAPTERS)) as r:
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
        async with rig(settings=Settings(health_interval_s=0.05, load_retry_s=30, adapter_dir=ADAPTERS)) as r:
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
