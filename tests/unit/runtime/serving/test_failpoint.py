"""The replica proxy's `serve-base-model` failpoint (runtime/serving/failpoint.py) on test_proxy.py's rig of fake vLLM
servers: inert without its file; armed, loads and unloads acknowledged without reaching a replica, completions naming
an adapter served by the base model, the swallowed adapters listed (or not, `unlisted`); disarmed, loads pass again."""

from __future__ import annotations

import json

from grpo_deploy.runtime.serving import failpoint as fp
from grpo_deploy.runtime.serving.adapter_sync import LOAD, UNLOAD
from grpo_deploy.runtime.serving.door import MODELS
from grpo_deploy.runtime.serving.http import Answer
from grpo_deploy.runtime.serving.proxy_args import Settings
from tests.unit.runtime.fake_vllm import BASE
from tests.unit.runtime.serving.test_proxy import FAST, rig, run


def settings(tmp_path) -> Settings:
    return Settings(**{**FAST.__dict__, "adapter_dir": str(tmp_path / ".vllm_lora")})


def arm(tmp_path, text: str = "") -> None:
    (tmp_path / ".failpoints").mkdir(exist_ok=True)
    (tmp_path / ".failpoints" / fp.SERVE_BASE_MODEL).write_text(text)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_file_sits_in_the_checkpoint_folder_beside_the_trainers_failpoints():
    assert fp.failpoint_path("/share/run/checkpoints/.vllm_lora") == \
        "/share/run/checkpoints/.failpoints/serve-base-model"
    assert fp.failpoint_path("") is None


def test_armed_is_looked_up_at_most_once_a_second_and_links_are_ignored(tmp_path):
    clock = Clock()
    point = fp.ServeBaseModel(str(tmp_path / ".vllm_lora"), clock)
    assert not point.armed()
    arm(tmp_path)
    assert not point.armed()  # looked up less than a second ago
    clock.now = 1.5
    assert point.armed() and point.listed
    (tmp_path / ".failpoints" / fp.SERVE_BASE_MODEL).write_text("unlisted\n")
    clock.now = 3.0
    assert point.armed() and not point.listed
    (tmp_path / ".failpoints" / fp.SERVE_BASE_MODEL).unlink()
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / ".failpoints" / fp.SERVE_BASE_MODEL).symlink_to(tmp_path / "elsewhere")
    clock.now = 4.5
    assert not point.armed()


def test_only_a_completion_naming_an_adapter_is_rewritten():
    body = json.dumps({"model": "trl-policy-v3", "prompt": [1, 2], "max_tokens": 4}).encode()
    assert json.loads(fp.ServeBaseModel.rewritten(body, BASE)) == {"model": BASE, "prompt": [1, 2], "max_tokens": 4}
    other = json.dumps({"model": BASE, "prompt": "x"}).encode()
    assert fp.ServeBaseModel.rewritten(other, BASE) is other
    assert fp.ServeBaseModel.rewritten(b"{junk", BASE) == b"{junk"
    assert fp.ServeBaseModel.rewritten(body, None) is body


def test_the_base_name_is_the_one_listed_model_that_is_no_adapter():
    listing = {"data": [{"id": BASE}, {"id": "trl-policy-v1", "parent": BASE}]}
    assert fp.base_name(Answer(200, json.dumps(listing).encode())) == BASE
    assert fp.base_name(Answer(200, b"junk")) is None
    assert fp.base_name(Answer(500, b"{}")) is None
    assert fp.base_name(None) is None
    two = {"data": [{"id": "a"}, {"id": "b"}]}
    assert fp.base_name(Answer(200, json.dumps(two).encode())) is None


def test_inert_without_its_file(tmp_path):
    async def scenario():
        async with rig(2, settings(tmp_path)) as r:
            status, _ = await r.post(LOAD, {"lora_name": "trl-policy-v1",
                                            "lora_path": str(tmp_path / ".vllm_lora" / "trl-policy-v1")})
            assert status == 200 and all("trl-policy-v1" in f.adapters for f in r.fakes)
            await r.complete([1, 2, 3], model="trl-policy-v1")
            assert [b["model"] for f in r.fakes for b in f.completions()] == ["trl-policy-v1"]

    run(scenario())


def test_armed_loads_are_acknowledged_unapplied_and_completions_served_by_the_base(tmp_path):
    async def scenario():
        async with rig(2, settings(tmp_path)) as r:
            arm(tmp_path)
            status, text = await r.post(LOAD, {"lora_name": "trl-policy-v2",
                                               "lora_path": str(tmp_path / ".vllm_lora" / "trl-policy-v2")})
            assert status == 200 and "added successfully" in text
            assert all(not f.adapters for f in r.fakes) and all(LOAD not in f.paths() for f in r.fakes)
            await r.complete([1, 2, 3], model="trl-policy-v2")  # the fakes 404 an adapter they do not hold
            assert [b["model"] for f in r.fakes for b in f.completions()] == [BASE]
            status, text = await r.get(MODELS)
            listed = {e["id"]: e.get("parent") for e in json.loads(text)["data"]}
            assert listed == {BASE: None, "trl-policy-v2": BASE}  # the list lies: only the probe can tell
            status, _ = await r.post(UNLOAD, {"lora_name": "trl-policy-v2"})
            assert status == 200 and all(UNLOAD not in f.paths() for f in r.fakes)

    run(scenario())


def test_unlisted_shows_the_replicas_truth_and_a_refused_body_is_still_refused(tmp_path):
    async def scenario():
        async with rig(2, settings(tmp_path)) as r:
            arm(tmp_path, "unlisted")
            await r.post(LOAD, {"lora_name": "trl-policy-v3",
                                "lora_path": str(tmp_path / ".vllm_lora" / "trl-policy-v3")})
            status, text = await r.get(MODELS)
            assert [e["id"] for e in json.loads(text)["data"]] == [BASE]
            status, _ = await r.post(LOAD, {"lora_name": "x", "lora_path": "/etc"})
            assert status == 400  # the door still checks what it acknowledges

    run(scenario())


def test_disarmed_loads_reach_the_replicas_again(tmp_path):
    async def scenario():
        async with rig(2, settings(tmp_path)) as r:
            arm(tmp_path)
            await r.post(LOAD, {"lora_name": "trl-policy-v4",
                                "lora_path": str(tmp_path / ".vllm_lora" / "trl-policy-v4")})
            (tmp_path / ".failpoints" / fp.SERVE_BASE_MODEL).unlink()
            r.proxy.failpoint._looked = None  # look again now, not a second later
            status, _ = await r.post(LOAD, {"lora_name": "trl-policy-v5",
                                            "lora_path": str(tmp_path / ".vllm_lora" / "trl-policy-v5")})
            assert status == 200 and all(set(f.adapters) == {"trl-policy-v5"} for f in r.fakes)

    run(scenario())
