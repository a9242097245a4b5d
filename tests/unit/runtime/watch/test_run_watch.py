"""The run watcher inside a running trainer (runtime/watch/run_watch.py) and verl's engine hook, WatchStop. TRL's hook,
WatcherCallback: runtime/trainer/test_callbacks.py."""

from __future__ import annotations

import os

import pytest

from grpo_deploy.common.metrics import MetricsSink, read_events
from grpo_deploy.runtime.verl.node import WatchStop
from grpo_deploy.runtime.watch.config import WatchConfig
from grpo_deploy.runtime.watch.run_watch import STOPPED_EARLY, RunWatch, history, read_history

# a bar no reward clears: the first full window is flat, and the stop comes `patience` steps later
FLAT = {"action": "stop", "window": 5, "patience": 3, "min_gain": 1000.0}


def config(**settings) -> WatchConfig:
    return WatchConfig.model_validate({"settings": {**FLAT, **settings}, "total_steps": 40, "gpus": 2,
                                       "objective": "per answer"})


def step(n: int, reward: float = 0.5) -> dict:
    return {"event": "step", "step": n, "time": 1000.0 + 5 * n, "reward": reward}


def test_history_starts_after_the_last_watcher_stop():
    before = [step(1), step(2), {"event": "run_end", "status": STOPPED_EARLY, "time": 1020.0}]
    after = [{"event": "run_start", "time": 1030.0}, step(3)]
    assert history(before + after) == after
    crashed = [step(1), {"event": "run_end", "status": "error", "time": 1010.0}, step(2)]
    assert history(crashed) == crashed  # a crash and its restart: the plateau's clock goes on


def test_read_history_is_empty_for_a_missing_file_and_refuses_a_fifo_without_hanging(tmp_path, caplog):
    assert read_history(str(tmp_path / "none.jsonl")) == []
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    assert read_history(str(fifo)) == []
    assert "starting cold" in caplog.text


def test_run_watch_emits_armed_findings_and_its_summary(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsSink(str(path)) as sink:
        watch = RunWatch(config(), sink.emit)
        stops = [watch.step(n, {"reward": 0.5}, now=1000.0 + 5 * n) for n in range(1, 12)]
        watch.summary()
    events = read_events(str(path))
    assert events[0]["event"] == "watch_armed" and events[0]["action"] == "stop" and events[0]["gpus"] == 2
    kinds = [(e["kind"], e["level"]) for e in events if e["event"] == "watch"]
    assert ("plateau", "warn") in kinds and ("plateau_stop", "stop") in kinds, kinds
    first_stop = next(i for i, s in enumerate(stops, 1) if s is not None)
    warned = next(e["step"] for e in events if e["event"] == "watch" and e["kind"] == "plateau")
    assert first_stop == warned + FLAT["patience"], (first_stop, warned)
    summary = events[-1]
    assert summary["event"] == "watch_summary" and summary["stop_step"] == first_stop
    assert summary["gpu_hours_saved"] == pytest.approx((40 - first_stop) * 5.0 * 2 / 3600, abs=1e-3)


def test_a_rising_reward_asks_for_no_stop():
    watch = RunWatch(config(min_gain=0.01), lambda *a, **k: {})
    assert all(watch.step(n, {"reward": 0.05 * n}, now=float(n)) is None for n in range(1, 20))


def test_a_resume_warms_up_on_the_runs_steps_and_keeps_the_plateau_clock():
    past = [step(n) for n in range(1, 8)]
    watch = RunWatch(config(), lambda *a, **k: {}, past)
    since = watch.watcher.state()["plateau_since"]
    assert since is not None and watch.stop is None  # judged from the replayed steps, before any new one
    stops = [watch.step(n, {"reward": 0.5}, now=1000.0 + 5 * n) for n in range(8, 8 + FLAT["patience"] + 1)]
    # flat since the window's first step, warned when the window filled (step 5), stopped patience steps later
    assert since == 1 and stops[0] is not None and stops[0].step == FLAT["window"] + FLAT["patience"], stops


def test_verl_is_stopped_only_after_a_step_that_saved():
    stopped = []
    watch = RunWatch(config(), lambda *a, **k: {})
    hook = WatchStop(watch, 4, lambda s: s % 4 == 0, lambda: stopped.append(True))
    for n in range(1, 20):
        hook.after_step(step(n))
        if stopped:
            break
    assert hook.stopped_at is not None and hook.stopped_at % 4 == 0 and hook.stopped_at >= watch.stop.step
    assert hook.stopped_at - watch.stop.step < 4 and stopped == [True]


def test_verl_that_never_saves_is_stopped_at_once():
    stopped = []
    watch = RunWatch(config(), lambda *a, **k: {})
    hook = WatchStop(watch, 0, lambda s: False, lambda: stopped.append(True))
    for n in range(1, 20):
        hook.after_step(step(n))
    assert hook.stopped_at == watch.stop.step and stopped == [True]


def test_verl_without_a_watcher_is_never_stopped():
    hook = WatchStop(None, 4, lambda s: True, lambda: pytest.fail("stopped without a watcher"))
    for n in range(1, 10):
        hook.after_step(step(n))
    assert hook.stopped_at is None


def test_a_served_policy_report_from_another_thread_is_judged_at_the_next_poll(tmp_path):
    import threading

    path = tmp_path / "metrics.jsonl"
    report = {"adapter": "trl-policy-v4", "verdict": "base", "listed": True, "base": "tiny", "max_abs_diff": 0.0,
              "threshold": 0.001, "syncs": 3, "b_norm": 0.3, "clear": False}
    with MetricsSink(str(path)) as sink:
        watch = RunWatch(config(min_gain=0.001), sink.emit)
        sender = threading.Thread(target=watch.report, args=(report,))
        sender.start()
        sender.join()
        assert watch.stop is None  # nothing judged off the training thread
        stop = watch.poll(6)
    assert stop is not None and stop.kind == "stale_policy" and stop.step == 6
    (event,) = [e for e in read_events(str(path)) if e["event"] == "watch"]
    assert event["kind"] == "stale_policy" and event["level"] == "stop" and event["adapter"] == "trl-policy-v4"
    assert event["message"].startswith("stale policy: ")


def test_verls_hook_judges_the_rollout_gap_each_step_and_stops_on_a_rollout_left_behind(tmp_path):
    """WatchStop runs verl's side of the served-policy check on each step: a served_policy event per step, and a
    stale_policy finding (the stop under action: stop) three steps after the gap left the floor."""
    from grpo_deploy.runtime.verl.rollout_check import MAX_KEY, MEAN_KEY

    stopped = []
    with MetricsSink(str(tmp_path / "m.jsonl")) as sink:
        watch = RunWatch(config(min_gain=0.001), sink.emit)  # a rising reward: only the gap can stop it
        hook = WatchStop(watch, 2, lambda s: s % 2 == 0, lambda: stopped.append(True), sink.emit)
        for n in range(1, 13):
            mean = 1e-7 if n <= 5 else 0.02
            hook.after_step({**step(n, 0.05 * n), MEAN_KEY: mean, MAX_KEY: mean * 10})
            if stopped:
                break
    events = read_events(str(tmp_path / "m.jsonl"))
    checks = [(e["step"], e["verdict"]) for e in events if e["event"] == "served_policy"]
    assert checks[:4] == [(1, "floor"), (2, "floor"), (3, "floor"), (4, "in-step")]
    (found,) = [e for e in events if e["event"] == "watch" and e["kind"] == "stale_policy"]
    assert found["level"] == "stop" and found["step"] == 8 and found["verdict"] == "rollout-gap"
    assert hook.stopped_at == 8 and stopped == [True]  # step 8 saves: stopped after it


def test_verls_hook_without_a_logged_gap_writes_no_check_events(tmp_path):
    with MetricsSink(str(tmp_path / "m.jsonl")) as sink:
        hook = WatchStop(RunWatch(config(min_gain=0.001), sink.emit), 2, lambda s: False, lambda: None, sink.emit)
        for n in range(1, 6):
            hook.after_step(step(n, 0.05 * n))
    assert not [e for e in read_events(str(tmp_path / "m.jsonl")) if e["event"] == "served_policy"]


def test_verls_hook_with_the_watcher_off_still_judges_and_says_a_finding_in_one_line(tmp_path, capsys):
    from grpo_deploy.runtime.verl.rollout_check import MAX_KEY, MEAN_KEY

    with MetricsSink(str(tmp_path / "m.jsonl")) as sink:
        hook = WatchStop(None, 2, lambda s: True, lambda: pytest.fail("stopped without a watcher"), sink.emit)
        for n in range(1, 10):
            mean = 1e-7 if n <= 4 else 0.02
            hook.after_step({**step(n), MEAN_KEY: mean, MAX_KEY: mean})
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "stale policy" in ln]
    assert len(lines) == 1 and "verl's rollout is not sampling" in lines[0] and "watcher is off" in lines[0]
    assert hook.stopped_at is None
    checks = [e for e in read_events(str(tmp_path / "m.jsonl")) if e["event"] == "served_policy"]
    assert len(checks) == 9 and checks[-1]["verdict"] == "off-policy"
