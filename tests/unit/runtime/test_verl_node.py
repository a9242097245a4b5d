"""grpo_deploy.runtime.verl_node: verl's per-step metrics as the kit's step events, the Ray head's arguments, Ray's
cluster token, the overrides file and the data step (verl itself runs in the integration suite's rehearsal)."""

from __future__ import annotations

import argparse
import json
import os
import stat
import time

import pytest

from grpo_deploy.runtime import verl_node
from grpo_deploy.runtime.metrics import MetricsSink, read_events


def test_a_verl_step_becomes_a_kit_step_with_the_seed_telemetry():
    data = {"critic/score/mean": 0.61, "response_length/mean": 22.5, "actor/grad_norm": 0.2, "timing_s/gen": 2.0,
            "val-core/grpo-deploy/brevity/reward/mean@1": 0.7, "global_seqlen/min": 1136.0, "actor/lr": "x"}
    event = verl_node.step_event({"step": 4, "data": data})
    assert event == {"step": 4, "reward": 0.61, "completions/mean_length": 22.5, "actor/grad_norm": 0.2,
                     "timing_s/gen": 2.0, "val-core/grpo-deploy/brevity/reward/mean@1": 0.7}
    assert verl_node.step_event({"step": "4", "data": {}}) is None
    assert verl_node.step_event({"data": data}) is None


def test_the_follower_emits_each_step_once_and_waits_for_a_torn_line(tmp_path, monkeypatch):
    monkeypatch.setattr(verl_node, "POLL_S", 0.05)
    source, sink_path = tmp_path / "verl.jsonl", tmp_path / "metrics.jsonl"
    sink = MetricsSink(str(sink_path))
    follower = verl_node.StepFollower(source, sink)
    follower.start()
    first, second = (json.dumps({"step": n, "data": {"critic/score/mean": 0.5}}) for n in (1, 2))
    with open(source, "w") as f:
        f.write(first + "\n" + second[:12])
        f.flush()
        time.sleep(0.3)
        f.write(second[12:] + "\n")
    follower.finish()
    sink.close()
    steps = [e for e in read_events(str(sink_path)) if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2]  # the torn line was read once whole, not as garbage
    assert follower.steps == 2 and all(e["reward"] == 0.5 for e in steps)


def test_ray_head_arguments_leave_zero_to_ray():
    args = argparse.Namespace(ray_port=6379, num_cpus=8, num_gpus=1, object_store_bytes=0)
    argv = verl_node.ray_start_argv(args)
    assert argv[:3] == ["ray", "start", "--head"] and "--num-cpus" in argv and "--num-gpus" in argv
    assert "--object-store-memory" not in argv
    args.num_cpus = args.num_gpus = 0
    assert "--num-cpus" not in verl_node.ray_start_argv(args) and "--num-gpus" not in verl_node.ray_start_argv(args)


def test_the_ray_token_is_made_once_private_and_never_through_a_link(tmp_path):
    path = verl_node.ensure_ray_token(tmp_path)
    token = path.read_text()
    assert len(token) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert verl_node.ensure_ray_token(tmp_path).read_text() == token  # kept, not replaced
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / ".ray").mkdir()
    os.symlink(tmp_path / "target", other / ".ray" / "auth_token")
    with pytest.raises(SystemExit, match="not a regular file"):
        verl_node.ensure_ray_token(other)
    assert not (tmp_path / "target").exists()


def test_overrides_skip_comments_and_blank_lines(tmp_path):
    path = tmp_path / "o.txt"
    path.write_text("# header\n\na=1\n  # indented comment\nb='x y'\n")
    assert verl_node.read_overrides(path) == ["a=1", "b='x y'"]


def test_data_is_written_for_brevity_kept_when_there_and_asked_for_otherwise(tmp_path):
    out = tmp_path / "brevity"
    assert verl_node.prepare_data("brevity", out, 16).endswith("written")
    assert (out / "train.parquet").is_file() and (out / "test.parquet").is_file()
    assert verl_node.prepare_data("brevity", out, 16).endswith("kept")
    with pytest.raises(SystemExit, match="grpo-deploy data prepare"):
        verl_node.prepare_data("gsm8k", tmp_path / "gsm8k", 0)
