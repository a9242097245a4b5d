"""grpo_deploy.runtime.verl.node: verl's per-step metrics as the kit's step events, the overrides file and the data
step (verl itself runs in the fault suite's rehearsals; Ray's start in test_ray_node.py)."""

from __future__ import annotations

import json
import time

import pytest

from grpo_deploy.common.metrics import MetricsSink, read_events
from grpo_deploy.runtime.verl import node as verl_node


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


def test_overrides_skip_comments_and_blank_lines(tmp_path):
    path = tmp_path / "o.txt"
    path.write_text("# header\n\na=1\n  # indented comment\nb='x y'\n")
    assert verl_node.read_overrides(path) == ["a=1", "b='x y'"]


def test_data_is_written_for_brevity_kept_when_there_and_asked_for_otherwise(tmp_path):
    out = tmp_path / "brevity"
    assert verl_node.prepare_data("brevity", out, 16).endswith("written")
    assert (out / "train.parquet").is_file() and (out / "test.parquet").is_file()
    assert verl_node.prepare_data("brevity", out, 16).endswith("kept")
    with pytest.raises(SystemExit, match="set dataset.path"):
        verl_node.prepare_data("gsm8k", tmp_path / "gsm8k", 0)


def test_retention_before_an_attempt_quarantines_the_cut_save_and_keeps_the_newest(tmp_path):
    from tests.unit.runtime.storage.test_checkpoints_verl import first_process, states, verl_save

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    first_process(ckpt)  # 20 (pruned by verl), 40, 60 complete; 80 cut short by a full disk
    sink_path = tmp_path / "metrics.jsonl"
    with MetricsSink(str(sink_path)) as sink:
        retention = verl_node.Retention(ckpt, 1, sink)
        assert retention.before_attempt().endswith("global_step_60")
        assert states(ckpt) == [(20, "pruned"), (60, "complete")]  # 40 removed behind 60; 80 moved aside
        verl_save(ckpt, 70)  # the resumed attempt's save: the tracker moves, the next step prunes behind it
        retention.after_step()
        assert states(ckpt) == [(20, "pruned"), (70, "complete")]
    events = {e["event"] for e in read_events(str(sink_path))}
    assert {"checkpoint_quarantine", "checkpoint_prune"} <= events
    assert (ckpt / "quarantine").is_dir()


def test_an_unreadable_tracker_stops_the_attempt_in_one_line(tmp_path):
    from tests.unit.runtime.storage.test_checkpoints_verl import verl_save

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    verl_save(ckpt, 5)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("")
    with MetricsSink(str(tmp_path / "m.jsonl")) as sink, pytest.raises(SystemExit, match="missing or unreadable"):
        verl_node.Retention(ckpt, 2, sink).before_attempt()
    assert (ckpt / "global_step_5" / "actor").is_dir()  # nothing moved or removed


def test_data_is_written_from_the_spec_jsonl_and_a_bad_row_is_refused_with_its_number(tmp_path):
    source = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": f"It is {i + 1}.\n#### {i + 1}"} for i in range(10)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "gsm8k"
    assert verl_node.prepare_data("gsm8k", out, 0, str(source)).endswith(f"written from {source}")
    assert (out / "train.parquet").is_file()
    source.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"question": "x", "answer": "no gold"}) + "\n")
    with pytest.raises(SystemExit, match="failed"):
        verl_node.prepare_data("gsm8k", tmp_path / "again", 0, str(source))
    assert not (tmp_path / "again" / "train.parquet").exists()  # nothing half-written


def _node_config(tmp_path, **changes) -> verl_node.VerlNodeConfig:
    data = {"run_dir": str(tmp_path / "run"), "dataset": "brevity", "data_dir": str(tmp_path / "data"),
            "checkpoint_dir": str(tmp_path / "ckpt"), "save_every": 5, "total_steps": 16,
            "watchdog": {"checkpoint_bytes": 10**6, "margin_bytes": 0}, **changes}
    return verl_node.VerlNodeConfig.model_validate(data)


def test_the_node_config_is_read_bounded_typed_and_never_through_a_link(tmp_path):
    good = tmp_path / "verl-node.json"
    good.write_text(_node_config(tmp_path).model_dump_json())
    assert verl_node.load_node_config(good).total_steps == 16
    link = tmp_path / "link.json"
    link.symlink_to(good)
    data = json.loads(good.read_text())
    for path, text, why in ((link, None, "symlink|Too many levels|ELOOP|loop"),
                            (tmp_path / "big.json", " " * (verl_node.CONFIG_MAX_BYTES + 1), "larger than"),
                            (tmp_path / "typed.json", json.dumps({**data, "keep": "2"}), "keep"),
                            (tmp_path / "extra.json", json.dumps({**data, "x": 1}), "x")):
        if text is not None:
            path.write_text(text)
        with pytest.raises(SystemExit, match=why):
            verl_node.load_node_config(path)


def test_the_watchdog_stops_verl_before_a_save_that_cannot_fit(tmp_path):
    stopped, free = [], [10**9]
    with MetricsSink(str(tmp_path / "m.jsonl")) as sink:
        dog = verl_node.SaveWatchdog(_node_config(tmp_path), sink, lambda: stopped.append(True), lambda _: free[0])
        assert [s for s in range(1, 17) if dog.saves_at(s)] == [5, 10, 15, 16]
        dog.after_step(4)  # step 5 saves, and fits
        assert not stopped
        free[0] = 10**5
        dog.after_step(6)  # step 7 does not save: nothing to judge
        assert not stopped
        dog.after_step(9)  # step 10 saves 1 MB into 100 KB: stopped before it
        assert stopped == [True] and "stopped before saving" in dog.tripped.message
    events = read_events(str(tmp_path / "m.jsonl"))
    assert [e["step"] for e in events if e["event"] == "disk_watchdog_stop"] == [9]
