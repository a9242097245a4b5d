"""The harness's pure parts (grpo_deploy.harness): trials, the spec it writes per shape, the render read back with the
server on loopback, nvidia-smi's table. The harness itself runs on a GPU: tests/gpu/test_harness.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from grpo_deploy import harness
from grpo_deploy.spec import profiles


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
    with pytest.raises(SystemExit, match="no profile matches"):
        harness.device_profile("NVIDIA L4")


def test_device_profile_by_gpu_name():
    assert harness.device_profile("NVIDIA H100 80GB HBM3") == "h100"
    assert harness.device_profile("NVIDIA H200") == "h200"


def test_a_profile_for_several_gpus_gets_the_one_gpu_split(tmp_path):
    spec = harness.trial_spec(harness.Trial("seed004", 4), "h200", tmp_path / "shared", tmp_path / "m")
    assert spec["overrides"]["vllm"]["gpu_memory_utilization"] == \
        profiles.load("h100").value("vllm", "gpu_memory_utilization")
    assert "gpu_memory_utilization" not in harness.trial_spec(
        harness.Trial("seed004", 4), "h100", tmp_path / "shared", tmp_path / "m")["overrides"]["vllm"]


def test_switches_off_on_an_80_gb_card_leave_the_fp32_trainer_room(tmp_path):
    off = harness.trial_spec(harness.Trial("seed004", 4, switches=False), "h100", tmp_path / "s", tmp_path / "m")
    assert off["overrides"]["vllm"]["gpu_memory_utilization"] == harness.SWITCHES_OFF_VLLM_MEMORY


def test_rehearsal_on_a_gpu_profile_takes_the_cpu_profiles_task(tmp_path):
    spec = harness.trial_spec(harness.Trial("rehearsal", 40), "h200", tmp_path / "shared", tmp_path / "m")
    cpu = profiles.load("cpu")
    trl = spec["overrides"]["trl"]
    assert trl["max_steps"] == 40 and trl["learning_rate"] == cpu.value("trl", "learning_rate")
    assert spec["overrides"]["lora"]["r"] == cpu.value("lora", "r")
    assert spec["overrides"]["model"]["path"] == str(tmp_path / "m")
    assert spec["hosts"][0]["gpus"] == {"server": [0], "trainer": [0]}
    assert "max_num_seqs" not in spec["overrides"].get("vllm", {})  # the GPU profile's server settings stay


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


def test_report_reads_the_trainers_own_metrics(tmp_path):
    import json
    import subprocess

    rendered = harness.render_trial(harness.Trial("rehearsal", 3), "cpu", tmp_path, tmp_path / "model")
    metrics = Path(rendered.trainer_config["metrics_path"])
    metrics.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"event": "run_start", "time": 0.0}]
    for i in range(1, 4):
        lines.append({"event": "adapter_load", "time": i - 0.5, "ok": True, "handoff_s": 0.02 * i})
        lines.append({"event": "step", "time": float(i), "step": i, "reward": 0.1 * i, "ratio": 1 + 0.001 * i,
                      "perf/step_s": 2.0 + i, "perf/fwd_bwd_s": 1.0, "perf/rollout_wait_s": 0.5,
                      "batch/samples_per_step": 128, "completions/mean_length": 1300.0})
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = subprocess.Popen(["true"])
    done.wait()
    role = harness.Role("trainer", done, tmp_path / "t.log", peak_mib=2048)
    server = harness.Role("server", done, tmp_path / "s.log", peak_mib=1024)
    r = harness.report(harness.Trial("rehearsal", 3), rendered, server, role, 12.0)
    assert (r["steps"], r["trainer_exit"], r["adapter_loads_ok"], r["adapter_loads_failed"]) == (3, 0, 3, 0)
    assert r["reward_first5"] == pytest.approx(0.2) and r["ratio_max"] == pytest.approx(1.003)
    assert r["step_s_median"] == 4.0 and r["samples_per_step"] == 128
    assert r["gpu_hours_per_500_steps"] == round(4.0 * 500 / 3600, 3)
    assert (r["server_peak_gib"], r["trainer_peak_gib"]) == (1.0, 2.0)
    harness.REPORT_LINE.format(**r)  # every key the line names is in the report


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "1e9", "$x", ""])
def test_bad_timeouts_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        harness.seconds(text)


def test_a_bad_flag_ends_in_one_usage_line_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        harness.main(["--trial", "rehearsal:4", "--out", str(tmp_path / "o"), "--trial-timeout", "nan"])
    assert exc.value.code == 2 and "seconds from 1 to 86400" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_an_out_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert harness.main(["--trial", "rehearsal:2", "--out", str(blocker / "o")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
