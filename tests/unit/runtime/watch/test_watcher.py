"""The run watcher's core (grpo_deploy/runtime/watch/watcher.py) on seeded seed-shaped streams and the real recorded
ones."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from grpo_deploy.runtime.watch.config import MetricKeys, WatchConfig, WatchSettings
from grpo_deploy.runtime.watch.watcher import Watcher
from tests.unit.runtime import watch_streams

METRICS = Path(__file__).resolve().parents[2] / "metrics"
# Bounds measured by benchmarks/watcher_alarms.py at the defaults (docs/MEASUREMENTS.md, issues 23 and 43): median 90
# and p95 130 steps over 1,000 streams; the test holds them with a margin over its smaller sample. Across noise levels:
# test_series.py.
DELAY_MEDIAN_MAX, DELAY_P95_MAX = 110, 160


def run(events, config: WatchConfig | None = None):
    watcher = Watcher(config or WatchConfig())
    found = []
    for event in events:
        if event.get("event") == "step":
            found += watcher.observe(event["step"], event, event["time"])
    return watcher, found


def kinds(found, level="warn"):
    return [f.kind for f in found if f.level == level]


def recorded(name: str) -> list[dict]:
    return [json.loads(line) for line in (METRICS / name).read_text().splitlines() if line.startswith("{")]


def test_seed000_plateau_is_flagged_once_and_stops_after_patience():
    events, onset = watch_streams.seed000(7)
    settings = WatchSettings(action="stop", patience=50)
    watcher, found = run(events, WatchConfig(settings=settings, total_steps=450, gpus=8))
    plateau = [f for f in found if f.kind == "plateau"]
    assert [f.level for f in plateau] == ["warn"], plateau  # edge-triggered: one warning, no repeats, no clear
    warn = plateau[0]
    assert onset < warn.step <= onset + DELAY_P95_MAX
    assert "flat since step" in warn.message and "\n" not in warn.message
    stop = watcher.stop
    assert stop is not None and stop.step == warn.step + 50 and stop.level == "stop"
    assert kinds(found, "stop") == ["plateau_stop"]
    state = watcher.state()
    rate = state["seconds_per_step"]
    assert rate == pytest.approx(watch_streams.SECONDS_PER_STEP)
    assert state["gpu_hours_saved"] == pytest.approx((450 - stop.step) * rate * 8 / 3600, rel=1e-3)
    assert state["steps_after_plateau"] == 450 - state["plateau_since"]
    assert state["gpu_hours_after_plateau"] == pytest.approx(state["steps_after_plateau"] * rate * 8 / 3600, rel=1e-3)
    assert state["plateau_since"] <= warn.step


def test_seed000_validation_plateau_where_the_key_appears():
    events, onset = watch_streams.seed000(3)
    _, found = run(events, WatchConfig(keys=MetricKeys(validation="val/accuracy")))
    val = [f for f in found if f.kind == "validation_plateau" and f.level == "warn"]
    assert len(val) == 1 and val[0].step > onset
    _, without = run(events)
    assert "validation_plateau" not in kinds(without)


def test_warn_action_never_stops():
    watcher, found = run(watch_streams.seed000(7)[0])
    assert "plateau" in kinds(found) and watcher.stop is None and kinds(found, "stop") == []


@pytest.mark.parametrize("seed", range(20))
def test_still_rising_stream_is_not_flagged(seed):
    _, found = run(watch_streams.rising(seed, noise=0.03))
    assert "plateau" not in kinds(found)


def test_false_alarm_rate_under_one_percent_and_detection_delay_bounded():
    settings = WatchSettings()
    false = sum("plateau" in kinds(run(watch_streams.rising(seed, settings.min_gain, settings.window))[1])
                for seed in range(400))
    assert false / 400 < 0.01, f"{false}/400 rising streams flagged"
    delays = []
    for seed in range(200):
        events, onset = watch_streams.plateaued(seed)
        warns = [f.step for f in run(events)[1] if f.kind == "plateau" and f.level == "warn"]
        assert warns, f"seed {seed}: plateau never flagged"
        delays.append(warns[0] - onset)
    assert min(delays) > -settings.window // 2  # a warning well before the onset would be a false alarm
    assert statistics.median(delays) <= DELAY_MEDIAN_MAX
    assert statistics.quantiles(delays, n=20)[-1] <= DELAY_P95_MAX


def test_the_cpu_rehearsal_is_rising_not_a_plateau():
    events = recorded("cpu_rehearsal.jsonl")
    rewards = [e["reward"] for e in events if e.get("event") == "step"]
    assert statistics.mean(rewards[-10:]) > statistics.mean(rewards[:10]) + 0.3  # it does rise
    watcher, found = run(events, WatchConfig(settings=WatchSettings(window=20, target_reward=0.9)))
    assert "plateau" not in kinds(found)
    state = watcher.state()
    assert state["slope_per_step"] > 0 and state["plateau_since"] is None
    # its answers shrink from 23 to ~10 tokens of a tiny cap: the cap share starts over 80% and the length drifts
    assert state["cap_share_peak"] > 0.8 and "cap_share" in kinds(found) and "length_drift" in kinds(found)


def test_the_verl_rehearsal_resume_rewinds_and_is_not_a_plateau():
    events = recorded("verl-rehearsal-cpu.jsonl")
    keys = MetricKeys(capped="response_length/clip_ratio", kl=None, ratio=None, staleness=None, samples=None)
    watcher, found = run(events, WatchConfig(settings=WatchSettings(window=10), keys=keys))
    assert "plateau" not in kinds(found)
    steps = [s for s, _ in watcher.reward.series.points]
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # the resumed steps 6-8 replaced, not doubled
    assert watcher.state()["seconds_per_step"] == pytest.approx(3.0, abs=0.1)


def test_seed004_cap_share_and_length_drift():
    events = watch_streams.seed004(5)
    watcher, found = run(events, WatchConfig(max_completion_length=3000))
    cap = [f for f in found if f.kind == "cap_share"]
    assert cap[0].level == "warn" and 40 < cap[0].step < 130 and "3000-token" in cap[0].message
    assert [f.level for f in cap] in (["warn", "clear"], ["warn"])
    assert 0.27 <= watcher.state()["cap_share_peak"] <= 0.40
    assert "length_drift" in kinds(found)


def test_objective_change_across_a_resume_is_named_both_ways():
    first, second = watch_streams.packed_pair(2)
    config = WatchConfig(objective="per-token over packed rows")
    watcher = Watcher(config)
    watcher.replay(first + second[:1])
    found = watcher.observe(second[1]["step"], second[1], second[1]["time"])
    change = [f for f in found if f.kind == "objective_change"]
    assert len(change) == 1
    assert "'per-answer mean' -> 'per-token over packed rows'" in change[0].message
    assert watcher.state()["objectives"] == ["per-answer mean", "per-token over packed rows"]
    later = []
    for event in second[2:]:
        later += watcher.observe(event["step"], event, event["time"])
    assert "objective_change" not in kinds(later)  # once, not every step
    same = Watcher(WatchConfig(objective="per-answer mean"))
    same.replay(first)
    assert same.observe(101, {"reward": 0.3}, first[-1]["time"] + 60) == []


def test_replay_then_observe_gives_the_state_of_observing_every_step():
    events, _ = watch_streams.seed000(11)
    config = WatchConfig(settings=WatchSettings(action="stop", target_reward=0.95), total_steps=450, gpus=2,
                         keys=MetricKeys(validation="val/accuracy"))
    whole, _ = run(events, config)
    resumed = Watcher(config)
    resumed.replay([{"event": "run_start", "time": 0.0}] + events[:300])
    for event in events[300:]:
        resumed.observe(event["step"], event, event["time"])
    assert resumed.state() == whole.state()
    assert resumed.stop == whole.stop
    json.dumps(whole.state())


def test_time_to_target_from_the_trend():
    events = [{"event": "step", "step": s, "time": 100.0 + 30 * s, "reward": 0.2 + 0.001 * s} for s in range(1, 201)]
    watcher, _ = run(events, WatchConfig(settings=WatchSettings(target_reward=0.5)))
    state = watcher.state()
    assert state["time_to_target_steps"] == pytest.approx(100, abs=1)
    assert state["time_to_target_s"] == pytest.approx(3000, rel=0.01)
    flat, _ = run([{**e, "reward": 0.3} for e in events], WatchConfig(settings=WatchSettings(target_reward=0.5)))
    assert flat.state()["time_to_target_s"] is None


def test_kl_ratio_and_staleness_out_of_band_warn_then_clear():
    rows = []
    for s in range(1, 61):
        bad = 20 <= s < 40
        rows.append({"event": "step", "step": s, "time": float(s), "reward": 0.5,
                     "kl": 0.9 if bad else 0.01, "ratio": 1.4 if bad else 1.0,
                     "sample/dropped_stale_total": 64.0 if bad else 0.0, "batch/samples_per_step": 64.0})
    _, found = run(rows, WatchConfig(settings=WatchSettings(window=10)))
    for kind in ("kl", "ratio", "staleness"):
        levels = [f.level for f in found if f.kind == kind]
        assert levels == ["warn", "clear"], (kind, levels)


def test_a_first_step_out_of_bounds_is_no_warning_five_are():
    # A base model's first answers run long: the demo's first step had most answers at the cap, then fewer. One step,
    # the first included, warns of nothing; the level checks judge once they hold five points.
    def rows(bad_steps):
        return [{"event": "step", "step": s, "time": float(s), "reward": 0.5, "kl": 0.9 if s in bad_steps else 0.01,
                 "ratio": 1.4 if s in bad_steps else 1.0, "completions/clipped_ratio": 0.6 if s in bad_steps else 0.05}
                for s in range(1, 21)]
    _, found = run(rows({1}))
    assert not [f for f in found if f.kind in ("kl", "ratio", "cap_share")], [f.message for f in found]
    _, found = run(rows(set(range(1, 21))))
    for kind in ("kl", "ratio", "cap_share"):
        warns = [f.step for f in found if f.kind == kind and f.level == "warn"]
        assert warns == [5], (kind, warns)


def test_non_numbers_and_nan_are_ignored():
    watcher = Watcher(WatchConfig())
    for s in range(1, 30):
        assert watcher.observe(s, {"reward": float("nan"), "kl": "x", "ratio": True}, float(s)) == []
    assert watcher.state()["reward_mean"] is None


def test_disabled_watcher_says_nothing():
    _, found = run(watch_streams.seed000(1)[0], WatchConfig(settings=WatchSettings(enabled=False)))
    assert found == []




# ---------------------------------------------------------------- the served-policy check's finding

STALE = {"adapter": "trl-policy-v7", "verdict": "base", "listed": True, "base": "tiny-qwen2", "max_abs_diff": 0.0,
         "threshold": 0.001, "syncs": 3, "b_norm": 0.42, "clear": False}


def test_a_stale_policy_warns_once_in_one_line_naming_the_adapter_the_answer_the_causes_and_the_fix():
    watcher = Watcher(WatchConfig())
    (found,) = watcher.served_policy(12, STALE)
    assert (found.kind, found.level, found.step) == ("stale_policy", "warn", 12) and watcher.stop is None
    line = found.message
    assert "\n" not in line and line.startswith("stale policy: ")
    for part in ("trl-policy-v7", "tiny-qwen2", "3 checked syncs", "0.42", "acknowledged but not applied",
                 "evicted", "stale prefix cache", "restart the server and resume", "watch.action: stop"):
        assert part in line, part
    assert watcher.served_policy(13, STALE) == []  # edge-triggered
    assert found.values["adapter"] == "trl-policy-v7" and "clear" not in found.values


def test_a_stale_policy_stops_at_once_under_action_stop():
    watcher = Watcher(WatchConfig(settings=WatchSettings(action="stop")))
    (found,) = watcher.served_policy(5, STALE)
    assert found.level == "stop" and watcher.stop is found and found.message.endswith("saving and stopping")
    assert watcher.state()["stop_step"] == 5


VERL_GAP = {"verdict": "rollout-gap", "step": 9, "gap_mean": 0.009, "gap_max": 0.18, "floor": 1e-7,
            "threshold": 0.001, "steps": 3}


def test_verls_rollout_gap_is_one_line_with_the_gap_the_floor_the_cause_and_the_fix_then_clears():
    watcher = Watcher(WatchConfig())
    (found,) = watcher.served_policy(9, VERL_GAP)
    line = found.message
    assert "\n" not in line and line.startswith("stale policy: verl's rollout is not sampling")
    for part in ("0.009 on average", "max 0.18", "3 steps in a row", "1e-07", "threshold 0.001",
                 "acknowledged but not applied", "resume from the last checkpoint", "watch.action: stop"):
        assert part in line, part
    assert set(found.values) == {"verdict", "gap_mean", "gap_max", "floor", "threshold", "steps"}
    (cleared,) = watcher.served_policy(12, {"verdict": "rollout-gap", "clear": True})
    assert cleared.level == "clear" and "verl's rollout samples the actor's policy again" in cleared.message


def test_verls_finding_planted_with_text_where_numbers_belong_prints_none_of_it():
    """What a metrics file holds is input: a string in a number's place is dropped, never printed."""
    watcher = Watcher(WatchConfig())
    planted = {**VERL_GAP, "gap_mean": "\x1b[31m1", "floor": "\x1b]0;x\x07", "adapter": "\x1b[2J"}
    (found,) = watcher.served_policy(9, planted)
    assert "\x1b" not in found.message and "\x07" not in found.message and "unknown on average" in found.message


def test_an_unlisted_adapter_is_named_so_and_a_clear_ends_the_warning():
    watcher = Watcher(WatchConfig())
    (found,) = watcher.served_policy(3, {**STALE, "verdict": "not-listed", "listed": False, "max_abs_diff": None})
    assert "does not list it in GET /v1/models" in found.message
    (cleared,) = watcher.served_policy(4, {"adapter": "trl-policy-v8", "verdict": "applied", "clear": True})
    assert cleared.level == "clear" and "stale_policy" not in watcher.state()["active"]
    assert watcher.served_policy(5, {"adapter": "trl-policy-v9", "clear": True}) == []


def test_a_stale_policy_report_with_junk_values_is_worded_without_them():
    watcher = Watcher(WatchConfig())
    (found,) = watcher.served_policy(1, {"adapter": "trl-policy-v1\x1b[2J" + "x" * 500, "verdict": "base",
                                         "max_abs_diff": float("nan"), "syncs": "three", "b_norm": [1]})
    assert "\x1b" not in found.message and "unknown" in found.message and len(found.message) < 1200
    assert "b_norm" not in found.values and "max_abs_diff" not in found.values


def test_a_disabled_watcher_takes_no_stale_policy_report():
    assert Watcher(WatchConfig(settings=WatchSettings(enabled=False))).served_policy(1, STALE) == []


def test_cap_share_off_says_nothing_and_a_bare_auto_means_0_2():
    rows = [{"event": "step", "step": s, "time": float(s), "reward": 0.5, "completions/clipped_ratio": 0.9}
            for s in range(1, 11)]
    watcher, found = run(rows, WatchConfig(settings=WatchSettings(cap_share=None)))
    assert "cap_share" not in kinds(found) and watcher.state()["cap_share_peak"] == 0.9  # still in status
    _, found = run(rows, WatchConfig(settings=WatchSettings(cap_share="auto")))
    assert [f.step for f in found if f.kind == "cap_share"] == [5]
    assert "(bound 20%" in [f.message for f in found if f.kind == "cap_share"][0]
