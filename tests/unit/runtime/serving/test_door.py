"""The replica proxy's door (runtime/serving/door.py) against fake vLLM servers (tests/unit/runtime/fake_vllm.py: real
aiohttp servers on 127.0.0.1 standing in for vLLM, recording every request): vLLM's dev-mode and unknown endpoints
answered 404 (405 for another method) in one line and seen by no replica; adapter loads and unloads refused before
any replica sees them (not JSON, too big, a bad name, a path outside the run's adapter folder or through a link out
of it); a good load passed on to every replica as checked; and every endpoint TRL 1.16's async GRPO client and the
kit's own callers use still passing, driven by their own code."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os

import aiohttp
import pytest

from grpo_deploy.runtime import health, run_token
from grpo_deploy.runtime.serving import door
from grpo_deploy.runtime.serving import proxy as rp
from grpo_deploy.runtime.serving.door import LOAD, UNLOAD
from grpo_deploy.runtime.storage import adapters
from tests.unit.runtime.fake_vllm import BASE
from tests.unit.runtime.serving.test_prefix_router import tokens
from tests.unit.runtime.serving.test_proxy import ADAPTERS, FAST, rig, run

GOOD = {"lora_name": "trl-policy-v1", "lora_path": f"{ADAPTERS}/trl-policy-v1", "load_inplace": False}


def seen(rig_) -> list[tuple[str, str]]:
    """What the replicas received besides the proxy's own health probes."""
    return [(m, p) for f in rig_.fakes for m, p, _ in f.calls if p != "/health"]


async def send(rig_, method: str, path: str, data=None, headers=None) -> tuple[int, str]:
    async with rig_.client.request(method, rig_.url + path, data=data, headers=headers) as response:
        return response.status, await response.text()


def one_line(text: str) -> str:
    """The refusal's reason: vLLM's error shape, one line."""
    message = json.loads(text)["error"]["message"]
    assert "\n" not in message and len(message) < 600, message
    return message


# ---------------------------------------------------------------- the allowlist


def test_the_allowlist_is_what_trl_and_the_kit_call():
    assert {(e.method, e.path) for e in door.ENDPOINTS.values() if e.how != "merged"} == {
        ("GET", "/health"), ("GET", "/server_info"), ("GET", "/v1/models"), ("GET", "/get_world_size"),
        ("POST", "/v1/completions"), ("POST", "/pause"), ("POST", "/resume"), ("POST", LOAD), ("POST", UNLOAD),
        ("GET", "/proxy/stats"),
    }
    assert all(e.callers for e in door.ENDPOINTS.values())


@pytest.mark.parametrize("method, path", [
    ("POST", "/collective_rpc"), ("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping"),
    ("POST", "/scale_elastic_ep"), ("GET", "/v1/unknown"), ("POST", "/v1/chat/completions"),
    ("POST", "/reset_prefix_cache"), ("POST", "/reset_mm_cache"), ("GET", "/ping"), ("GET", "/metrics"),
    ("POST", "/tokenize"), ("GET", "/v1/completions/"), ("POST", "/V1/completions"), ("GET", "/health/"),
    ("POST", "/v1/load_lora_adapter/x"), ("GET", "/v1/models/" + "x" * 5000),
])
def test_anything_not_on_the_list_is_404_in_one_line_and_no_replica_sees_it(method, path):
    async def scenario():
        async with rig() as r:
            status, text = await send(r, method, path, data=b'{"method": "x"}')
            assert status == 404, text
            message = one_line(text)
            assert "not passed on by the replica proxy" in message and "POST /v1/completions" in message
            assert seen(r) == [] and r.proxy.stats()["refused"] == 1

    run(scenario())


@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/completions"), ("GET", "/pause"), ("POST", "/health"), ("DELETE", "/v1/models"),
    ("GET", LOAD), ("PUT", UNLOAD), ("POST", "/proxy/stats"), ("HEAD", "/server_info"),
])
def test_a_listed_path_with_another_method_is_405_and_no_replica_sees_it(method, path):
    async def scenario():
        async with rig() as r:
            async with r.client.request(method, r.url + path) as response:
                assert response.status == 405
                assert response.headers["Allow"] == door.ENDPOINTS[path].method
                if method != "HEAD":
                    assert "the replica proxy takes only" in one_line(await response.text())
            assert seen(r) == []

    run(scenario())


def test_paths_sent_raw_are_matched_as_they_are_decoded_never_passed_on_as_sent():
    async def scenario():
        async with rig() as r:
            host, port = r.url.removeprefix("http://").split(":")
            statuses = []
            for target in ("/v1/completions/../../collective_rpc", "/v1/%2e%2e/collective_rpc", "//collective_rpc",
                           "/%63ollective_rpc"):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
                             "{}".encode())
                await writer.drain()
                statuses.append(int((await reader.readline()).split()[1]))
                writer.close()
                await writer.wait_closed()
            assert all(400 <= s < 500 for s in statuses), statuses
            assert seen(r) == []
            # an allowed path written with an escape is the allowed path, passed on as the list spells it
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /server_%69nfo?config_format=json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await writer.drain()
            assert int((await reader.readline()).split()[1]) == 200
            writer.close()
            await writer.wait_closed()
            assert ("GET", "/server_info?config_format=json") in [(m, p) for f in r.fakes for m, p, _ in f.calls]

    run(scenario())


# ---------------------------------------------------------------- adapter loads and unloads


def _load_refusals():
    name = "trl-policy-v1"
    cases = [
        ({**GOOD, "lora_path": f"{ADAPTERS}/../etc/{name}"}, 400, "not an absolute, normalised path"),
        ({**GOOD, "lora_path": f"{ADAPTERS}/./{name}"}, 400, "not an absolute, normalised path"),
        ({**GOOD, "lora_path": f"{ADAPTERS}//{name}"}, 400, "not an absolute, normalised path"),
        ({**GOOD, "lora_path": f"{ADAPTERS}/{name}/"}, 400, "not an absolute, normalised path"),
        ({**GOOD, "lora_path": f"adapters/{name}"}, 400, "not an absolute, normalised path"),
        ({**GOOD, "lora_path": f"/etc/{name}"}, 403, "lies outside /adapters"),
        ({**GOOD, "lora_path": "/adapters-x/trl-policy-v1"}, 403, "lies outside /adapters"),
        ({**GOOD, "lora_path": f"{ADAPTERS}/trl-policy-v2"}, 403, "the adapter's own folder"),
        ({**GOOD, "lora_path": f"{ADAPTERS}/x/{name}"}, 403, "the adapter's own folder"),
        ({**GOOD, "lora_path": f"{ADAPTERS}/{name}\n"}, 400, "unprintable"),
        ({**GOOD, "lora_name": "../trl-policy-v1"}, 400, "not an adapter name of the kit"),
        ({**GOOD, "lora_name": "trl-policy-v1\n"}, 400, "not an adapter name of the kit"),
        ({**GOOD, "lora_name": "trl-policy-v"}, 400, "not an adapter name of the kit"),
        ({**GOOD, "lora_name": "trl-policy-v\uff11"}, 400, "not an adapter name of the kit"),
        ({**GOOD, "lora_name": "tiny-qwen2"}, 400, "not an adapter name of the kit"),
        ({**GOOD, "lora_name": "trl-policy-v" + "1" * 40}, 400, "not an adapter name of the kit"),
        ({**GOOD, "lora_name": 1}, 400, "lora_name must be a string"),
        ({**GOOD, "load_inplace": "no"}, 400, "load_inplace must be a boolean"),
        ({**GOOD, "base_model_name": "x"}, 400, "unknown key base_model_name"),
        ({"lora_name": name}, 400, "lora_path missing"),
    ]
    return [(json.dumps(body).encode(), status, says) for body, status, says in cases] + [
        (b"lora_name=trl-policy-v1", 400, "body is not JSON"),
        (b"", 400, "body is not JSON"),
        (b'{"lora_name": "trl-policy-v1", "lora_path": "/adapters/trl-policy-v1"', 400, "body is not JSON"),
        (b"\xff\xfe{}", 400, "body is not JSON"),
        (b'{"lora_name": "trl-policy-v1", "lora_path": "/adapters/trl-policy-v1", "lora_path": "/etc"}', 400,
         "body is not JSON"),
        (b'{"lora_name": "trl-policy-v1", "lora_path": "/adapters/trl-policy-v1", "load_inplace": NaN}', 400,
         "body is not JSON"),
        (b"[" * 10_000 + b"]" * 10_000, 400, "body is not JSON"),
        (b'["trl-policy-v1"]', 400, "not a JSON object"),
    ]


@pytest.mark.parametrize("body, status, says", _load_refusals(), ids=lambda v: v if isinstance(v, int) else None)
def test_a_bad_load_is_refused_before_any_replica_sees_it(body, status, says):
    async def scenario():
        async with rig() as r:
            got, text = await send(r, "POST", LOAD, data=body, headers={"Content-Type": "application/json"})
            assert got == status and says in one_line(text), text
            assert seen(r) == [] and r.proxy.stats()["adapters"] == []

    run(scenario())


async def raw_post(rig_, path: str, head: str, body: bytes) -> tuple[int, str]:
    """POST *body* as it is after *head* (the framing headers) on a socket of its own, the whole of it written (the
    proxy reads what it did not need and drops it), and the status and body of the answer."""
    host, port = rig_.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{head}\r\n".encode() + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1].decode()


def test_a_10_mb_load_is_refused_at_64_kib_with_or_without_its_length():
    big = json.dumps({**GOOD, "pad": "x" * (10 * 1024 * 1024)}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (big[i:i + 65536] for i in range(0, len(big), 65536)))

    async def scenario():
        async with rig() as r:
            for head, body in ((f"Content-Length: {len(big)}\r\n", big),
                               ("Transfer-Encoding: chunked\r\n", chunks + b"0\r\n\r\n")):
                status, text = await raw_post(r, LOAD, head, body)
                assert status == 413 and "over 64 KiB" in one_line(text), text
            assert seen(r) == []

    run(scenario())


@pytest.mark.parametrize("body, says", [
    (b"not json", "body is not JSON"),
    (json.dumps({"lora_name": "../../x"}).encode(), "not an adapter name of the kit"),
    (json.dumps({"lora_name": "trl-policy-v1", "lora_int_id": 1}).encode(), "unknown key lora_int_id"),
    (json.dumps({"lora_path": "/adapters/trl-policy-v1"}).encode(), "unknown key lora_path"),
])
def test_a_bad_unload_is_refused_before_any_replica_sees_it(body, says):
    async def scenario():
        async with rig() as r:
            status, text = await send(r, "POST", UNLOAD, data=body)
            assert status == 400 and says in one_line(text), text
            assert seen(r) == []

    run(scenario())


def _share(tmp_path):
    """A run's adapter folder on a share the proxy sees, an adapter as TRL writes it, and a secret outside it."""
    folder = tmp_path / "share" / "ck" / ".vllm_lora"
    adapter = folder / "trl-policy-v1"
    adapter.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors", "README.md"):
        (adapter / name).write_text("{}")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "adapter_model.safetensors").write_text("not the run's")
    return folder, adapter, outside


def test_links_out_of_the_adapter_folder_are_refused_where_the_proxy_sees_the_share(tmp_path):
    folder, adapter, outside = _share(tmp_path)
    (folder / "trl-policy-v2").symlink_to(outside)  # the adapter's folder itself a link out
    (folder / "trl-policy-v3").symlink_to(adapter)  # a link, even one that stays inside
    v4 = folder / "trl-policy-v4"
    (v4 / "sub").mkdir(parents=True)
    (v4 / "sub" / "adapter_model.safetensors").symlink_to(outside / "adapter_model.safetensors")  # deep inside
    (folder / "trl-policy-v5").write_text("a file")
    settings = dataclasses.replace(FAST, adapter_dir=str(folder))

    async def scenario():
        async with rig(settings=settings) as r:
            for name, says in (("trl-policy-v2", "is a link"), ("trl-policy-v3", "is a link"),
                               ("trl-policy-v4", "holds a link out of the adapter folder: 'sub/adapter_"),
                               ("trl-policy-v5", "is not a folder")):
                body = {"lora_name": name, "lora_path": str(folder / name), "load_inplace": False}
                status, text = await r.post(LOAD, body)
                assert status == 403 and says in one_line(text), text
            assert seen(r) == []

    run(scenario())


def test_a_good_load_reaches_every_replica_as_checked_with_only_its_authorization(tmp_path):
    folder, adapter, _ = _share(tmp_path)
    (adapter / "tokenizer.json").symlink_to(adapter / "README.md")  # a link that stays inside is fine
    settings = dataclasses.replace(FAST, adapter_dir=str(folder))

    async def scenario():
        async with rig(3, settings=settings) as r:
            body = b'{"lora_path": "%s",   "lora_name": "trl-policy-v1"}' % str(adapter).encode()
            headers = {"Authorization": "Bearer k", "X-Planted": "1", "Content-Type": "text/plain"}
            status, text = await send(r, "POST", LOAD, data=body, headers=headers)
            assert status == 200, text
            for fake in r.fakes:
                ((method, path, got),) = [c for c in fake.calls if c[1] == LOAD]
                assert got == {"lora_path": str(adapter), "lora_name": "trl-policy-v1"}
            assert r.proxy.stats()["adapters"] == ["trl-policy-v1"]
            assert r.proxy.sync.adapters["trl-policy-v1"].headers == {"Authorization": "Bearer k"}

    run(scenario())


def test_without_an_adapter_folder_every_load_is_refused():
    async def scenario():
        async with rig(settings=dataclasses.replace(FAST, adapter_dir="")) as r:
            status, text = await r.load("trl-policy-v1")
            assert status == 403 and "--adapter-dir" in text and seen(r) == []

    run(scenario())


# ---------------------------------------------------------------- what TRL and the kit call still passes


def test_trl_s_own_client_and_the_kit_s_callers_go_through(tmp_path, monkeypatch):
    vllm_client = pytest.importorskip("trl.experimental.async_grpo.vllm_client")
    monkeypatch.setattr(vllm_client, "logger", logging.getLogger("trl"))  # accelerate's wants a PartialState
    folder, adapter, _ = _share(tmp_path)
    settings = dataclasses.replace(FAST, adapter_dir=str(folder))

    async def scenario():
        async with rig(settings=settings) as r:
            client = vllm_client.VLLMClient(r.url, 10)
            port = int(r.url.rsplit(":", 1)[1])
            # AsyncGRPOTrainer._init_lora_sync, get_train_dataloader; WeightTransferClient's reads
            await asyncio.to_thread(client.wait_for_server_ready)
            info = await asyncio.to_thread(client.get_server_info)
            assert info["parallel_config"]["data_parallel_size"] == 1
            assert await asyncio.to_thread(client.get_max_model_len) == 512
            assert await asyncio.to_thread(client.get_world_size) == 1
            # the kit: the bring-up's readiness and first token, the stale-adapter sweep
            assert (await asyncio.to_thread(health.server_healthy, port, BASE))[0]
            assert (await asyncio.to_thread(health.first_token, port, BASE, 10))[0]
            assert await asyncio.to_thread(adapters.unload_stale, r.url) == []
            # AsyncGRPOTrainer._sync_weight_lora: pause, load, resume, unload
            await asyncio.to_thread(client.pause)
            await asyncio.to_thread(client.load_lora_adapter, "trl-policy-v1", str(adapter))
            await asyncio.to_thread(client.resume)
            assert all(f.adapters == {"trl-policy-v1": str(adapter)} and not f.paused for f in r.fakes)
            await r.complete(tokens(1), "trl-policy-v1")  # AsyncRolloutWorker._generate_one_turn
            await asyncio.to_thread(client.unload_lora_adapter, "trl-policy-v1")
            assert all(f.adapters == {} for f in r.fakes)
            assert await asyncio.to_thread(adapters.resume_server, r.url)
            status, text = await r.get("/proxy/stats")
            assert status == 200 and json.loads(text)["refused"] == 0
            # merged sync: refused with its reason, never forwarded
            with pytest.raises(Exception, match="501.*adapter sync"):
                await asyncio.to_thread(client.init_weight_transfer_engine, {})
            assert r.proxy.stats()["refused"] == 1

    run(scenario(), 60)
    assert os.path.isdir(adapter)


# ---------------------------------------------------------------- the run's token


TOKEN = run_token.make()
GUARDED = dataclasses.replace(FAST, token=TOKEN)


@pytest.mark.parametrize("method, path", [
    ("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/pause"), ("POST", LOAD),
    ("GET", "/proxy/stats"), ("POST", "/collective_rpc"), ("POST", "/sleep"), ("POST", "/scale_elastic_ep"),
    ("GET", "/nowhere"),
])
def test_without_the_run_s_token_everything_is_401_in_one_line_and_no_replica_sees_it(method, path):
    wrong = run_token.make()

    async def scenario():
        async with rig(settings=GUARDED) as r:
            for headers, query in (({}, ""), ({"Authorization": f"Bearer {wrong}"}, ""),
                                   ({"Authorization": TOKEN}, ""), ({"Authorization": f"Basic {TOKEN}"}, ""),
                                   ({"X-Api-Key": TOKEN}, ""), ({}, f"?token={TOKEN}&api_key={TOKEN}"),
                                   ({"Authorization": f"Bearer {TOKEN}x"}, ""),
                                   ({"Authorization": f"Bearer {TOKEN[:-1]}"}, "")):
                async with r.client.request(method, r.url + path + query, json=GOOD, headers=headers) as response:
                    text = await response.text()
                    assert response.status == 401, (headers, query, text)
                    assert response.headers["WWW-Authenticate"].startswith("Bearer")
                message = one_line(text)
                assert "the run's token is missing or wrong" in message
                assert TOKEN not in text and wrong not in text and "not passed on" not in text
            assert seen(r) == [] and r.proxy.stats()["refused"] == 8

    run(scenario())


def test_two_authorization_headers_are_refused_even_when_one_is_right():
    async def scenario():
        async with rig(settings=GUARDED) as r:
            from multidict import CIMultiDict

            headers = CIMultiDict([("Authorization", f"Bearer {TOKEN}"), ("Authorization", "Bearer x")])
            status, _ = await send(r, "GET", "/v1/models", headers=headers)
            assert status == 401 and seen(r) == []

    run(scenario())


def test_with_the_token_the_allowlist_still_decides_and_the_replicas_get_the_token(caplog):
    async def scenario():
        async with rig(settings=GUARDED) as r:
            auth = run_token.headers(TOKEN)
            status, text = await send(r, "POST", "/collective_rpc", data=b"{}", headers=auth)
            assert status == 404 and "not passed on" in one_line(text)
            status, _ = await send(r, "GET", "/v1/models", headers=auth)
            assert status == 200
            status, _ = await send(r, "POST", "/v1/completions", headers={**auth, "Content-Type": "application/json"},
                                   data=json.dumps({"model": BASE, "prompt": tokens(1), "max_tokens": 1}))
            assert status == 200
            assert seen(r) == [("GET", "/v1/models"), ("GET", "/v1/models"), ("POST", "/v1/completions")]
            assert r.proxy.session.headers["Authorization"] == f"Bearer {TOKEN}"  # its own probes and resyncs

    caplog.set_level(logging.INFO)
    run(scenario())
    assert TOKEN not in caplog.text


def test_a_proxy_reaches_a_guarded_front_only_with_the_token():
    """The trainer's replica proxy in front of another host's front (a replica proxy with the run's token before its
    own vLLM): with the token its health probes and the trainer's calls pass; without it the front is never healthy
    and nothing reaches the vLLM server behind it."""
    async def scenario():
        async with rig(n=1, settings=GUARDED) as front:
            for settings, healthy in ((GUARDED, True), (FAST, False)):
                outer = rp.ReplicaProxy([front.url], settings)
                runner = aiohttp.web.AppRunner(outer.app(), access_log=None)
                await runner.setup()
                try:
                    await asyncio.sleep(0.5)  # ten health probes
                    assert outer.replicas[0].healthy is healthy, outer.replicas[0].why
                    if not healthy:
                        assert "401" in outer.replicas[0].why
                finally:
                    await runner.cleanup()
            assert [c for c in seen(front) if c[1] != "/health"] == []

    run(scenario())


def test_the_kit_s_own_callers_send_the_token_from_their_environment(monkeypatch):
    async def scenario():
        async with rig(settings=GUARDED) as r:
            port = int(r.url.rsplit(":", 1)[1])
            monkeypatch.delenv(run_token.ENV, raising=False)
            assert not (await asyncio.to_thread(health.server_healthy, port, BASE))[0]
            assert not await asyncio.to_thread(adapters.resume_server, r.url)
            monkeypatch.setenv(run_token.ENV, TOKEN)
            assert (await asyncio.to_thread(health.server_healthy, port, BASE))[0]
            assert (await asyncio.to_thread(health.first_token, port, BASE, 10))[0]
            assert await asyncio.to_thread(adapters.unload_stale, r.url) == []
            assert await asyncio.to_thread(adapters.resume_server, r.url)
            assert r.proxy.stats()["refused"] == 2

    run(scenario(), 60)
