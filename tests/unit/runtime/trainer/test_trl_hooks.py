"""Runtime rebinding of TRL names: the instrumented adapter-load client, the CPU peak-FLOPs lookup, the failpoints."""

import pickle
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("trl.experimental.async_grpo")

from trl.experimental.async_grpo import async_grpo_trainer as trainer_module  # noqa: E402
from trl.experimental.async_grpo import vllm_client as client_module  # noqa: E402

from grpo_deploy.runtime.storage.adapters import AdapterPublisher
from grpo_deploy.runtime.storage.faults import StorageFault
from grpo_deploy.runtime.trainer import trl_hooks
from tests.unit.runtime.stub_server import StubServer  # noqa: E402


def publisher(tmp_path, events):
    return AdapterPublisher(lambda event, **f: events.append((event, f)) or f, str(tmp_path), keep=4)


def test_successful_load_is_recorded(tmp_path):
    events = []
    with StubServer({("POST", "/v1/load_lora_adapter"): (200, "Success")}) as server:
        client = trl_hooks.InstrumentedVLLMClient(server.url, 5, publisher(tmp_path, events))
        client.load_lora_adapter("trl-policy-v1", "/x/trl-policy-v1")
    expected = {"lora_name": "trl-policy-v1", "lora_path": "/x/trl-policy-v1", "load_inplace": False}
    assert server.requests[0][2] == expected
    ((event, fields),) = events
    assert event == "adapter_load" and fields["status"] == 200 and fields["ok"] and fields["error"] is None
    assert client_module.requests.__name__ == "requests"  # the swap is undone


def test_404_no_adapter_found_is_an_unreadable_adapter_not_a_missing_endpoint(tmp_path):
    events = []
    body = {"error": {"message": "Loading lora trl-policy-v2 failed: No adapter found for /x", "code": 404}}
    with StubServer({("POST", "/v1/load_lora_adapter"): (404, body)}) as server:
        client = trl_hooks.InstrumentedVLLMClient(server.url, 5, publisher(tmp_path, events))
        with pytest.raises(StorageFault) as raised:
            client.load_lora_adapter("trl-policy-v2", str(tmp_path / "trl-policy-v2"))
    fault = raised.value.fault
    assert fault.kind == "adapter-unreadable" and fault.path == str(tmp_path / "trl-policy-v2")
    assert "could not read adapter trl-policy-v2" in fault.message and "No adapter found" in fault.message
    assert "does not expose" in str(raised.value.__cause__)  # TRL's own exception is the cause, unchanged
    fields = events[0][1]
    assert fields["status"] == 404 and not fields["ok"] and "No adapter found" in fields["error"]
    assert "No adapter found" in client.last_failure
    assert client_module.requests.__name__ == "requests"


def test_a_really_missing_endpoint_keeps_trls_error(tmp_path):
    with StubServer({}) as server:  # the stub answers 404 {"detail": "Not Found"} for unknown routes
        client = trl_hooks.InstrumentedVLLMClient(server.url, 5, publisher(tmp_path, []))
        with pytest.raises(RuntimeError, match="does not expose"):
            client.load_lora_adapter("trl-policy-v2", "/x")


def test_unreachable_server_is_recorded_without_status(tmp_path):
    events = []
    client = trl_hooks.InstrumentedVLLMClient("http://127.0.0.1:9", 5, publisher(tmp_path, events))
    with pytest.raises(OSError):  # requests.ConnectionError
        client.load_lora_adapter("trl-policy-v1", "/x", timeout=2)
    assert events[0][1]["status"] is None and "Error" in events[0][1]["error"]


def test_client_pickles_as_plain_trl_client(tmp_path):
    client = trl_hooks.InstrumentedVLLMClient("http://h:1", 7, publisher(tmp_path, []))
    restored = pickle.loads(pickle.dumps(client))
    assert type(restored) is client_module.VLLMClient and restored.server_url == "http://h:1"


def test_neutralise_peak_flops(monkeypatch):
    monkeypatch.setattr(trainer_module, "get_peak_flops_per_device", trainer_module.get_peak_flops_per_device)
    trl_hooks.neutralise_peak_flops()
    assert trainer_module.get_peak_flops_per_device(None, "float32") is None


def test_instrument_adapter_sync_rebinds_save_and_client(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "save_lora_adapter", trainer_module.save_lora_adapter)
    original = trainer_module.save_lora_adapter
    trainer = type("T", (), {})()
    trainer.vllm_client = client_module.VLLMClient("http://h:1", 3)
    trainer._lora_dir = "/elsewhere"
    pub = publisher(tmp_path / "out" / ".vllm_lora", [])
    trl_hooks.instrument_adapter_sync(trainer, pub)
    assert trainer_module.save_lora_adapter.__wrapped__ is original
    assert isinstance(trainer.vllm_client, trl_hooks.InstrumentedVLLMClient)
    assert trainer._lora_dir == pub.lora_dir == str(tmp_path / "out" / ".vllm_lora")


def test_first_successful_load_warms_the_lora_path_once(tmp_path):
    import time

    routes = {("POST", "/v1/load_lora_adapter"): (200, "Success"), ("POST", "/v1/completions"): (200, {"choices": []})}
    with StubServer(routes) as server:
        client = trl_hooks.InstrumentedVLLMClient(server.url, 5, publisher(tmp_path, []))
        client.load_lora_adapter("trl-policy-v1", "/x/trl-policy-v1")
        client.load_lora_adapter("trl-policy-v2", "/x/trl-policy-v2")
        deadline = time.time() + 10
        while time.time() < deadline and not any(r[1] == "/v1/completions" for r in server.requests):
            time.sleep(0.05)
        time.sleep(0.2)
    warm = [r for r in server.requests if r[1] == "/v1/completions"]
    assert len(warm) == 1
    assert warm[0][2]["model"] == "trl-policy-v1" and warm[0][2]["max_tokens"] == 1


def test_an_acknowledged_load_and_only_that_is_handed_to_the_served_policy_check(tmp_path):
    submitted = []
    check = SimpleNamespace(submit=lambda name, path: submitted.append((name, path)))
    with StubServer({("POST", "/v1/load_lora_adapter"): (200, "Success")}) as server:
        client = trl_hooks.InstrumentedVLLMClient(server.url, 5, publisher(tmp_path, []), check)
        client.warmed = True
        client.load_lora_adapter("trl-policy-v1", "/x/trl-policy-v1")
    with StubServer({("POST", "/v1/load_lora_adapter"): (500, "no")}) as server:
        client = trl_hooks.InstrumentedVLLMClient(server.url, 5, publisher(tmp_path, []), check)
        with pytest.raises(Exception):  # noqa: B017 - TRL's own error for a refused load
            client.load_lora_adapter("trl-policy-v2", "/x/trl-policy-v2")
    assert submitted == [("trl-policy-v1", "/x/trl-policy-v1")]
    trainer = type("T", (), {})()
    trainer.vllm_client = client_module.VLLMClient("http://h:1", 3)
    trl_hooks.instrument_adapter_sync(trainer, publisher(tmp_path, []), check)
    assert trainer.vllm_client.served_check is check


# ------------------------------------------------------------------ failpoints (fault suite hooks)

class SavingTrainer:
    """Only the method the failpoint wraps, recording its calls."""

    def __init__(self):
        self.saved = []

    def _save_rng_state(self, checkpoint_dir):
        self.saved.append(checkpoint_dir)


def arm(output_dir, text: str):
    flag = output_dir / trl_hooks.FAILPOINT_DIR / trl_hooks.PAUSE_MID_SAVE
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.write_text(text)
    return flag


def test_failpoint_inert_without_its_file(tmp_path):
    trainer, events = SavingTrainer(), []
    trl_hooks.install_failpoints(trainer, str(tmp_path), lambda *a, **k: events.append((a, k)))
    trainer._save_rng_state("/x/checkpoint-20")
    assert trainer.saved == ["/x/checkpoint-20"] and events == []


def test_failpoint_pauses_once_announces_and_is_used_up(tmp_path):
    trainer, events = SavingTrainer(), []
    flag = arm(tmp_path, "0.2")
    trl_hooks.install_failpoints(trainer, str(tmp_path), lambda event, **k: events.append((event, k)))
    started = time.time()
    trainer._save_rng_state("/x/checkpoint-40")
    assert time.time() - started >= 0.2 and trainer.saved == ["/x/checkpoint-40"]
    assert events == [("failpoint", {"name": "pause-mid-save", "checkpoint": "/x/checkpoint-40", "seconds": 0.2})]
    assert not flag.exists()
    trainer._save_rng_state("/x/checkpoint-60")  # used up: the next save does not pause
    assert len(events) == 1


@pytest.mark.parametrize("text", ["nan", "-1", "601", "inf", "1e9", "$(id)"])
def test_failpoint_with_a_bad_value_is_ignored(tmp_path, text):
    trainer, events = SavingTrainer(), []
    arm(tmp_path, text)
    trl_hooks.install_failpoints(trainer, str(tmp_path), lambda *a, **k: events.append(a))
    started = time.time()
    trainer._save_rng_state("/x/checkpoint-40")
    assert events == [] and trainer.saved == ["/x/checkpoint-40"] and time.time() - started < 5


# ---------------------------------------------------------------- the run's token


def test_trl_s_client_and_rollout_session_send_the_run_s_token_through_a_guarded_front(tmp_path, monkeypatch):
    """TRL's own VLLMClient (its `requests` calls) and the rollout loop's aiohttp session, against a real replica
    proxy that asks for the run's token: refused without the hook, through with it."""
    import asyncio
    import dataclasses
    import logging

    import aiohttp
    import requests

    from grpo_deploy.runtime import run_token
    from tests.unit.runtime.fake_vllm import BASE
    from tests.unit.runtime.serving.test_proxy import FAST, rig, run

    token = run_token.make()
    monkeypatch.setattr(client_module, "logger", logging.getLogger("trl"))
    monkeypatch.setattr(client_module, "requests", requests)  # undone after the test
    monkeypatch.delenv(run_token.ENV, raising=False)
    assert not trl_hooks.send_run_token() and client_module.requests is requests  # no token: nothing rebound
    monkeypatch.setenv(run_token.ENV, token)

    async def scenario():
        async with rig(n=1, settings=dataclasses.replace(FAST, token=token)) as r:
            client = client_module.VLLMClient(r.url, 5)
            with pytest.raises(Exception, match="401"):
                await asyncio.to_thread(client.pause)
            assert trl_hooks.send_run_token() and trl_hooks.send_run_token()  # once rebound, kept
            assert isinstance(client_module.requests, trl_hooks._TokenRequests)
            await asyncio.to_thread(client.wait_for_server_ready)
            assert await asyncio.to_thread(client.get_max_model_len) == 512
            await asyncio.to_thread(client.pause)
            await asyncio.to_thread(client.resume)
            # the rollout loop in the spawned child: its session gets the token from the inherited environment
            loop = trl_hooks.TokenRolloutLoop.__new__(trl_hooks.TokenRolloutLoop)
            async with aiohttp.ClientSession() as session:
                loop.session = session
                payload = {"model": BASE, "prompt": [1, 2, 3], "max_tokens": 1}
                async with loop.session.post(f"{r.url}/v1/completions", json=payload) as response:
                    assert response.status == 200
            loop.session = None
            assert loop.session is None
            assert r.proxy.stats()["refused"] == 1

    run(scenario(), 60)


def test_the_rollout_worker_runs_the_token_loop_only_with_a_token(monkeypatch):
    from trl.experimental.async_grpo import async_rollout_worker as rollout_module

    from grpo_deploy.runtime import run_token

    assert pickle.loads(pickle.dumps(trl_hooks.TokenRolloutLoop)) is trl_hooks.TokenRolloutLoop  # by reference
    assert issubclass(trl_hooks.TokenRolloutLoop, rollout_module._AsyncRolloutLoop)
    worker = object.__new__(rollout_module.AsyncRolloutWorker)  # its __init__ wants vLLM installed
    trainer = type("T", (), {"rollout_worker": worker})()
    monkeypatch.delenv(run_token.ENV, raising=False)
    trl_hooks.token_for_rollouts(trainer)
    assert worker._loop_cls is rollout_module._AsyncRolloutLoop
    monkeypatch.setenv(run_token.ENV, run_token.make())
    trl_hooks.token_for_rollouts(trainer)
    assert worker._loop_cls is trl_hooks.TokenRolloutLoop

@pytest.mark.parametrize("staleness, per_step, queue, inflight, generations, budget, groups", [
    (2, 16, 8, 8, 8, 0, 1),  # the cpu rehearsal: buffer 8 + in flight 8 + scoring 8 + 1 group = 2 steps
    (3, 16, 8, 8, 8, 0, 3),  # one more step of staleness: two more groups
    (100, 512, 16, 8, 1, 0, trl_hooks.TRL_SCORE_QUEUE_GROUPS),  # never more than TRL's own
    (3, 16, 16, 8, 3, 0, 7),  # rounded up: 48 - 16 - 8 - 3 = 21 answers, in groups of 3
    (2, 16, 8, 16, 8, 0, 1),  # more in flight than the staleness leaves room for: still one group
    (0, 16, 16, 8, 8, 0, None),  # strict: the buffer alone holds all it allows; TRL's own queue
    (4, 128, 1024, 128, 16, 0, None),  # TRL's default buffer: the buffer is the look-ahead
    (4, 128, 0, 512, 16, 0, None),  # an unbounded buffer: no bound to derive
    (3, 16, 8, 8, 8, 16384, None),  # packing: a step's rows hold any number of answers
])
def test_the_score_queue_holds_what_the_staleness_allows(staleness, per_step, queue, inflight, generations, budget,
                                                          groups):
    assert trl_hooks.score_queue_groups(staleness, per_step, queue, generations, inflight, budget) == groups


def test_the_rebound_worker_passes_the_bound_to_the_rollout_loop(monkeypatch):
    from trl.experimental.async_grpo import async_rollout_worker

    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda *a, **k: True)  # vLLM is in the images
    monkeypatch.setattr(async_rollout_worker, "is_aiohttp_available", lambda: True)
    base = trainer_module.AsyncRolloutWorker
    monkeypatch.setattr(trainer_module, "AsyncRolloutWorker", base)

    def args(**changes):  # the cpu rehearsal's settings: one group
        return SimpleNamespace(**{"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
                                  "max_staleness": 2, "queue_maxsize": 8, "num_generations": 8,
                                  "max_inflight_tasks": 8, "token_budget": 0, **changes})

    assert trl_hooks.bound_score_queue(args(max_staleness=3), 1) == 3
    assert trl_hooks.bound_score_queue(args(), 1) == 1  # a second trainer in the process rebinds the same base
    bound = trainer_module.AsyncRolloutWorker
    assert bound is not base and bound.__mro__[1] is base
    worker = bound(queue_maxsize=16, num_generations=8)
    assert worker._loop_kwargs["score_queue_maxsize"] == 1 and worker._loop_kwargs["queue_maxsize"] == 16
    assert isinstance(worker, base)  # what the trainer's isinstance checks ask
    assert bound(queue_maxsize=16, score_queue_maxsize=5)._loop_kwargs["score_queue_maxsize"] == 5
    assert trl_hooks.bound_score_queue(args(token_budget=512), 1) is None  # packing: TRL's own worker again
    assert trainer_module.AsyncRolloutWorker is base
