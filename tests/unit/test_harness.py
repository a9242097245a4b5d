"""The harness's pure parts (grpo_deploy.harness): trials, the spec it writes per shape, the render read back with the
server on loopback, nvidia-smi's table. The harness itself runs on a GPU: tests/gpu/test_harness.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from grpo_deploy import harness, profiles


@pytest.mark.parametrize("text, expected", [
    ("rehearsal:40", harness.Trial("rehearsal", 40)),
    ("seed004:20:3000:off", harness.Trial("seed004", 20, 3000, False)),
    ("seed004:5:1300", harness.Trial("seed004", 5, 1300, True)),
])
def test_trials_parse(text, expected):
    assert harness.parse_trial(text) == expected


@pytest.mark.parametrize("text", ["rehearsal", "other:4", "seed004:0", "seed004:9999", "seed004:4:5000",
                                  "seed004:4:1300:maybe", "seed004:$x", "seed004:4:1300:on:x", "-rehearsal:4"])
def test_bad_trials_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        harness.parse_trial(text)


def test_trial_names_differ_per_shape_length_and_switches():
    names = {harness.parse_trial(t).name for t in ("rehearsal:4", "seed004:4:1300:on", "seed004:4:1300:off",
                                                   "seed004:4:3000:on")}
    assert len(names) == 4


def test_device_profile_without_a_gpu_is_cpu():
    assert harness.device_profile(None) == "cpu"


def test_device_profile_refuses_an_unknown_gpu():
    with pytest.raises(SystemExit, match="no one-GPU profile"):
        harness.device_profile("NVIDIA L4")


def test_rehearsal_on_a_gpu_profile_takes_the_cpu_profiles_task(tmp_path):
    spec = harness.trial_spec(harness.Trial("rehearsal", 40), "h200", tmp_path / "shared", tmp_path / "m")
    cpu = profiles.load("cpu")
    trl = spec["overrides"]["trl"]
    assert trl["max_steps"] == 40 and trl["learning_rate"] == cpu.value("trl", "learning_rate")
    assert spec["overrides"]["lora"]["r"] == cpu.value("lora", "r")
    assert spec["overrides"]["model"]["path"] == str(tmp_path / "m")
    assert spec["hosts"][0]["gpus"] == {"server": [0], "trainer": [0]}
    assert "vllm" not in spec["overrides"]  # the GPU profile's server settings stay


def test_seed004_holds_128_answers_per_step_at_each_length(tmp_path):
    for tokens in (1300, 3000):
        trial = harness.Trial("seed004", 10, tokens, switches=False)
        spec = harness.trial_spec(trial, "h200", tmp_path / "shared", tmp_path / "m")
        trl = spec["overrides"]["trl"]
        per_row = 16384 // (tokens + 64)
        assert 128 <= trl["gradient_accumulation_steps"] * per_row < 128 + per_row
        assert trl["max_completion_length"] == tokens
        assert spec["overrides"]["vllm"]["max_model_len"] == 4024  # one server serves both lengths
        assert spec["overrides"]["runtime"] == harness.SWITCHES_OFF


def test_render_is_read_back_and_the_trainer_reaches_the_server_on_loopback(tmp_path):
    model = tmp_path / "model"
    rendered = harness.render_trial(harness.Trial("rehearsal", 3), "cpu", tmp_path, model)
    assert "--model" in rendered.server_args and str(model) in rendered.server_args
    assert rendered.server_env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert rendered.trainer_config["async_grpo"]["vllm_server_base_url"] == "http://server:8000"
    local = harness.yaml.safe_load(harness.local_trainer_config(rendered).read_text())
    assert local["async_grpo"]["vllm_server_base_url"] == "http://127.0.0.1:8000"
    assert {k: v for k, v in local.items() if k != "async_grpo"} == \
        {k: v for k, v in rendered.trainer_config.items() if k != "async_grpo"}
    assert Path(rendered.trainer_config["metrics_path"]).is_relative_to(tmp_path / "shared")


def test_nvidia_smi_compute_apps_are_summed_per_pid_and_junk_is_skipped():
    text = "123, 4000\n123, 96\n77, 512\n[N/A], 3\nx\n"
    assert harness.parse_compute_apps(text) == {123: 4096, 77: 512}


def test_median():
    assert harness._median([]) is None
    assert harness._median([3.0, 1.0, 2.0]) == 2.0
    assert harness._median([1.0, 2.0, 4.0, 3.0]) == 2.5


def test_trials_that_differ_only_on_the_trainer_side_share_one_server(tmp_path):
    model = tmp_path / "model"
    keys = {harness.render_trial(harness.parse_trial(t), "cpu", tmp_path, model).server_key
            for t in ("seed004:4:1300:on", "seed004:4:3000:off")}
    assert len(keys) == 1
    other = harness.render_trial(harness.parse_trial("rehearsal:4"), "cpu", tmp_path, model).server_key
    assert other not in keys  # another max_model_len: a server of its own
