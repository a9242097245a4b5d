"""Tests of grpo_deploy.status: summary from events, torn lines, progress text, plot."""

from __future__ import annotations

import json

from grpo_deploy import status
from grpo_deploy.common.metrics import parse_events
from grpo_deploy.engines.trl_async import TRL_ASYNC
from grpo_deploy.engines.verl import VERL


def _events():
    ev = [{"event": "up_start", "time": 100.0}, {"event": "server_ready", "time": 140.0, "seconds": 40.0},
          {"event": "run_start", "time": 141.0, "uid": 1000, "gid": 1000, "umask": "0022"}]
    for i in range(1, 11):
        ev.append({"event": "step", "time": 150.0 + 3 * i, "step": i, "reward": 0.1 * i,
                   "completions/mean_length": 20 - i, "sample/staleness_mean": 0.5, "ratio": 1.0 + 0.001 * i})
        ev.append({"event": "adapter_load", "time": 150.0 + 3 * i, "ok": True, "status": 200, "handoff_s": 0.05 * i,
                   "mode": "0600"})
    ev.append({"event": "adapter_load", "time": 190.0, "ok": False, "status": 404, "handoff_s": None})
    ev.append({"event": "run_end", "time": 200.0, "status": "ok", "steps": 10})
    return ev


def test_summary_figures():
    s = status.summarize("r", _events(), max_steps=10)
    assert s.state == "finished" and s.steps == 10
    assert s.reward_first5 == 0.3 and s.reward_last5 == 0.8
    assert s.adapter_loads_ok == 10 and s.adapter_loads_failed == 1
    assert s.median_handoff_s == 0.275
    assert s.server_ready_s == 40.0 and s.up_to_first_step_s == 53.0
    assert s.step_time_median_s == 3.0 and s.run_uid == 1000
    assert s.adapter_file_modes == ["0600"]


def test_up_to_first_step_leaves_the_image_build_out_and_reports_it_apart():
    built = [*_events(), {"event": "images_ready", "time": 130.0, "build_s": 25.5}]
    s = status.summarize("r", built, max_steps=10)
    assert s.images_build_s == 25.5 and s.up_to_first_step_s == 53.0 - 25.5
    assert "image build 25.5 s, not counted" in status.summary_text(s)
    stale = [{"event": "images_ready", "time": 50.0, "build_s": 300.0}, *_events()]  # an earlier `up`'s build
    assert status.summarize("r", stale).up_to_first_step_s == 53.0
    assert status.summarize("r", _events()).images_build_s is None


def test_failed_run_and_torn_line():
    text = "\n".join(json.dumps(e) for e in _events()[:-1])
    text += '\n{"event": "run_end", "time": 201, "status": "error", "error": "boom"}\n{"event": "st'
    s = status.summarize("r", parse_events(text))
    assert s.state == "failed" and s.error == "boom"


def test_empty_is_not_started():
    assert status.summarize("r", []).state == "not-started"


def test_progress_line_and_text():
    line = status.progress_line({"step": 3, "reward": 0.25}, 40, TRL_ASYNC.progress)
    assert line.startswith("step 3/40") and "reward 0.250" in line and "staleness -" in line
    verl = status.progress_line({"step": 2, "reward": 0.5, "actor/grad_norm": 0.25, "timing_s/gen": 2.04}, 30,
                                VERL.progress)
    assert verl == "step 2/30  reward 0.500  len -  kl -  grad 0.250  gen s 2.0  update s -  step s -"
    assert "hand-off" in status.summary_text(status.summarize("r", _events()))


def test_plot_writes_png(tmp_path):
    path = status.plot(_events(), str(tmp_path / "p.png"))
    assert open(path, "rb").read(4) == b"\x89PNG"


def test_plot_title():
    assert status.plot_title("rehearsal") == "grpo-deploy run rehearsal"
    assert status.plot_title() == "grpo-deploy run"




def test_watch_ends_when_the_run_has_ended(tmp_path):
    """`status --watch` redraws until the run's record says it ended (here: at once), then exits 0."""
    import subprocess
    import sys

    from grpo_deploy.deploy import run_state
    from grpo_deploy.spec import new_spec, resolve

    state = run_state.RunState(resolve.resolve(new_spec.embedded_default()), root=tmp_path / ".grpo-deploy")
    state.emit("up_start", run="rehearsal")
    state.emit("up_end", status="ok", trainer_exit=0)
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "status", "--watch", "1", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, proc.stderr
    assert len(records) == 1 and records[0]["state"] == "finished" and "checkpoint_disk" in records[0]


def test_a_storage_fault_is_named_in_status():
    message = "shared volume: the shared directory /shared/x is read-only (Read-only file system) ..."
    events = [*_events()[:-1], {"event": "storage_fault", "time": 199.0, "kind": "read-only", "message": message},
              {"event": "run_end", "time": 200.0, "status": "storage-fault", "error": message, "steps": 10}]
    s = status.summarize("r", events)
    assert s.state == "failed" and s.fault == message
    text = status.summary_text(s)
    assert "(stopped by a shared-volume fault, below)" in text and "(error:" not in text
    assert f"stopped by          {message}" in text
    earlier = [{"event": "storage_fault", "time": 120.0, "message": "old"}, *_events()]  # before the latest start
    assert status.summarize("r", earlier).fault is None


def test_the_servers_own_view_is_added_to_the_fault():
    from grpo_deploy.deploy.supervise import view_words

    seen = {"path": "/s/l/v7", "blocked": "/s/l", "problem": "no access", "mode": "0700", "owner": "0:0", "uid": 1000}
    words = view_words(seen)
    assert words == "/s/l is mode 0700, owner 0:0 (no access)"
    events = [{"event": "run_start", "time": 1.0}, {"event": "storage_fault", "time": 2.0, "message": "unreadable."},
              {"event": "server_view", "time": 3.0, "words": words, "uid": 1000, "gid": 1000}]
    assert status.summarize("r", events).fault == f"unreadable. As the server (uid 1000:1000) sees it: {words}."
    assert status.fault_text(events[:2]) == "unreadable." and status.fault_text([]) is None


def test_phases_of_the_latest_up_each_end_at_its_milestone():
    events = [{"event": "up_start", "time": 0.0}, {"event": "step", "step": 9, "time": 1.0},  # an earlier up
              {"event": "up_start", "time": 100.0}, {"event": "images_ready", "time": 312.0},
              {"event": "preflight_done", "time": 315.5}, {"event": "server_ready", "time": 370.0},
              {"event": "step", "step": 1, "time": 380.0}, {"event": "step", "step": 2, "time": 388.0},
              {"event": "step", "step": 3, "time": 396.0}, {"event": "up_end", "time": 400.0}]
    assert status.phases(events) == [("images", 212.0), ("preflight", 3.5), ("server ready", 54.5),
                                     ("first step", 10.0), ("2 more steps", 16.0), ("total", 300.0)]
    assert status.phases_text(events) == ("phases: images 212 s · preflight 3.5 s · server ready 54 s · "
                                          "first step 10 s · 2 more steps 16 s · total 300 s")


def test_phases_leave_out_what_did_not_happen():
    failed = [{"event": "up_start", "time": 0.0}, {"event": "images_ready", "time": 5.0},
              {"event": "up_end", "time": 6.0, "status": "preflight-failed"}]
    assert status.phases(failed) == [("images", 5.0), ("total", 6.0)]
    assert status.phases_text([]) == "" and status.phases([{"event": "step", "time": 1.0}]) == []


def test_a_verl_summary_shows_its_phases_not_adapter_syncs():
    from pathlib import Path

    from grpo_deploy.common.metrics import read_events

    events = read_events(str(Path(__file__).parent / "metrics" / "verl-rehearsal-cpu.jsonl"))
    s = status.summarize("verl-rehearsal", events, max_steps=16)
    assert s.steps == 16 and s.reward_last5 > s.reward_first5
    assert set(s.phase_medians_s) >= {"gen", "old_log_prob", "update_actor"} and "step" not in s.phase_medians_s
    text = status.summary_text(s)
    assert "phases (median)     gen " in text and "adapter syncs" not in text and "KL / grad norm" in text


def test_a_verl_plot_has_the_phase_and_update_panels(tmp_path):
    from pathlib import Path

    import matplotlib.image

    from grpo_deploy.common.metrics import read_events

    events = read_events(str(Path(__file__).parent / "metrics" / "verl-rehearsal-cpu.jsonl"))
    verl_png = status.plot(events, str(tmp_path / "verl.png"))
    trl_png = status.plot(_events(), str(tmp_path / "trl.png"))
    assert matplotlib.image.imread(verl_png).shape[0] > matplotlib.image.imread(trl_png).shape[0]  # 4 panels, not 3


WATCH = {"settings": {"action": "stop", "window": 5, "patience": 3, "min_gain": 1000.0, "target_reward": 2.0},
         "total_steps": 40, "gpus": 2, "objective": "per answer"}


def test_a_running_run_replays_its_steps_through_the_watcher():
    running = _events()[:-1]
    s = status.summarize("r", running, max_steps=40, watch=WATCH)
    assert s.state == "running" and s.watch["step"] == 10 and s.watch["plateau_since"] is not None
    assert s.watch["slope_per_step"] > 0 and s.watch["time_to_target_steps"] > 0  # rising 0.1/step toward 2.0
    text = status.summary_text(s)
    assert "run watcher         reward trend" in text and "flat since step" in text and "target 2 in ~" in text
    assert "loss objective      per answer" in text
    assert status.summarize("r", running, max_steps=40).watch is None  # no config, no replay: nothing made up


def test_a_watcher_stop_is_its_own_end_state_with_the_saving():
    ev = _events()[:-1] + [
        {"event": "watch", "time": 181.0, "kind": "plateau", "level": "warn", "step": 5, "message": "flat\nsince 1"},
        {"event": "watch", "time": 182.0, "kind": "cap_share", "level": "warn", "step": 6, "message": "capped"},
        {"event": "watch", "time": 183.0, "kind": "cap_share", "level": "clear", "step": 8, "message": "back"},
        {"event": "watch_summary", "time": 199.0, "enabled": True, "step": 10, "plateau_since": 1, "window": 5,
         "steps_after_plateau": 9, "gpu_hours_after_plateau": 0.03, "gpus": 2, "gpu_hours_saved": 0.05},
        {"event": "run_end", "time": 200.0, "status": "stopped-early", "steps": 10,
         "error": "run watcher: reward flat since step 1 (stopped at step 10)"}]
    s = status.summarize("r", ev, max_steps=40, watch=WATCH)
    assert s.state == "stopped-early" and s.error is None and "stopped at step 10" in s.stopped_early
    assert s.watch["gpu_hours_saved"] == 0.05  # the runtime's own last word wins over a replay
    assert [f["kind"] for f in s.watch_findings] == ["plateau"]  # the cap warning cleared
    assert s.watch_findings[0]["message"] == "flat since 1"  # read back as one printable line
    text = status.summary_text(s)
    assert "stopped early       run watcher: reward flat since step 1" in text
    assert "30 planned steps not run (~1.5 min, 0.05 GPU-h)" in text
    assert "stopped-early" in status.ENDED


def test_the_plot_marks_the_watchers_plateau_stop_and_target(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    ev = _events() + [{"event": "watch_armed", "time": 141.5, "target_reward": 0.9},
                      {"event": "watch", "time": 170.0, "kind": "plateau", "level": "warn", "step": 6},
                      {"event": "watch", "time": 180.0, "kind": "plateau_stop", "level": "stop", "step": 9}]
    drawn = {}
    real_savefig = plt.Figure.savefig

    def keep(fig, path, **kwargs):  # read what the reward panel holds before the figure is closed
        drawn["labels"] = [line.get_label() for line in fig.axes[0].get_lines()]
        return real_savefig(fig, path, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    status.plot(ev, str(tmp_path / "p.png"))
    assert drawn["labels"][1:] == ["watcher: flat", "watcher: stop", "target reward"], drawn
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_what_a_container_wrote_is_read_as_figures_or_a_dash_and_printed_without_escapes():
    """A step's figures that are text, a bool, infinite or too large for a float read as missing ('-'); an events file
    with skipped lines adds one note line; text read back loses its control characters and escapes."""
    ev = _events()[:-1] + [
        {"event": "step", "time": 190.5, "step": "11\x1b[2J", "reward": float("inf"), "ratio": True},
        {"event": "lines_skipped", "time": 191.0, "source": "metrics.jsonl", "lines": 2,
         "why": {"a number too long": 1, "a line over 1 MiB": 1}},
        {"event": "lines_skipped", "time": 191.0, "source": "x", "lines": "two", "why": 5},  # not the reader's own
        {"event": "run_end", "time": 200.0, "status": "failed", "error": "boom\x1b]0;title\x07\u202e!"}]
    s = status.summarize("r", ev, max_steps=40)
    assert s.steps == 10 and s.reward_last5 == 0.8 and s.importance_ratio_max == 1.01
    text = status.summary_text(s)
    assert "(error: boom!)" in text and "\x1b" not in text and "\u202e" not in text
    assert text.splitlines()[-1] == "note: 2 lines of metrics.jsonl skipped (a line over 1 MiB, a number too long)"
    assert status.progress_line(ev[-4], 40) == "step -/40  reward -  len -"
    assert status.finite(10**400) is None and status.finite(float("nan")) is None and status.finite(3) == 3
    assert status.step_of({"step": 4.0}) == 4 and status.step_of({"step": "4"}, 7) == 7
