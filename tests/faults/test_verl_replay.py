"""The real verl rehearsal under faults: `grpo-deploy up` on the cpu profile with engine verl (real verl 0.9.1 as a
driver joining the Ray head in the verl-cpu container, FSDP2 + LoRA on gloo, the colocated real vLLM CPU rollout,
through the kit's platform plugin), on a real tmpfs that replays seed 000's disk (sized by the plan's own estimate to
hold three checkpoints, not four), in the order a user of the seed's A100 node would meet it:

1. the seed's configuration (keep all, watchdog off): `plan` names the 4th save as the one that fails and preflight
   refuses, nothing starts. (verl's real checkpoints here are smaller than the plan's estimate, 1.7 MB against
   10 MB, so the ENOSPC itself is shown with the real saves by the TRL replay, tests/faults/test_disk_full_replay.py.)
2. Guarded (keep 2, watchdog on): other data fills the disk after global_step_4 is saved; the watchdog stops verl
   before the next save (the head exits 3, nothing half-written, global_step_4 kept) and `up` says what to free.
3. The ballast removed, `up` resumes from global_step_4.
4. The run ends at STEPS with the reward risen over the whole run and the kit's retention holding 2 complete
   checkpoints over both attempts' saves.
5. The stale policy on verl's side, on the resumed attempt: from step ARM_AFTER the rollout failpoint swallows verl's
   LoRA syncs (acknowledged, not applied: verl #7495 made on purpose, runtime/verl/failpoint.py); verl's own gap
   between the rollout's and the actor's probabilities of the rollout's answers leaves its floor, and the watcher
   warns in one line within STALE_WITHIN steps (`up` prints it); the failpoint removed, the next sync applies and
   the warning clears. No check before it called the rollout off-policy.

A Ray head SIGKILLed mid-run (an OOM kill or a reboot), `up` restarting it and verl resuming from its newest complete
global_step_N, is tests/faults/test_verl_cluster.py's second fault (the head of a two-host cluster: the same restart
path, and the cluster formed again); this replay carried it too until that test joined CI, one verl start-up more.

About 4 minutes on 2 cores once the verl-cpu image exists (two verl start-ups)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from grpo_deploy.runtime.serving.failpoint import FAILPOINT_DIR
from grpo_deploy.runtime.storage.checkpoints import list_checkpoints
from grpo_deploy.runtime.verl.failpoint import ROLLOUT_KEEPS_ADAPTER
from tests.faults.replay_disk import (
    UP_TIMEOUT_S,
    complete_steps,
    fill_when,
    guarded,
    kb,
    on_share,
    plan_names_the_save_and_preflight_refuses,
    run_events,
    seed_tmpfs,
    up,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.verl_rehearsal]

RUN = "verl-replay"
STEPS, SAVE_EVERY = 20, 2  # saves at 2, 4, ... 20
ARM_AFTER = 9  # the resumed attempt (steps 5-20) learns its gap floor on steps 5-7
# steps from the arming to the warning: the sync of the next step may be under way already, the gap needs a few missed
# updates to pass its threshold (2 here: a run on this machine warned at step 14 for an arming after step 9), then AFTER
# (3) steps over it
STALE_WITHIN = 7
SEEN: dict = {}  # what the guarded replay's resumed attempt showed, for the stale-policy row below


@pytest.fixture()
def verl_disk(tmp_path, docker_client):
    with seed_tmpfs(tmp_path, "verl", RUN, SAVE_EVERY, {"verl": {"trainer.total_training_steps": STEPS}}) as run:
        yield run


def test_verl_seed000_plan_names_the_save_that_fails_and_preflight_refuses(verl_disk, verl_image, docker_client,
                                                                           fault_row):
    run = verl_disk
    fault_row.update(fault=f"seed 000 replayed on verl: keep all, watchdog off, a save every {SAVE_EVERY} of {STEPS} "
                           f"steps into a {kb(run['size'])} tmpfs (holds 3 checkpoints by the plan, not 4)",
                     expected="plan names the failing save; preflight refuses; nothing started")
    disk = plan_names_the_save_and_preflight_refuses(run, docker_client, SAVE_EVERY, RUN)
    fault_row.update(observed=f"plan: save {disk['fails_at_save']} (step {disk['fails_at_step']}) fails, "
                              f"{kb(disk['checkpoint_bytes'])} per checkpoint estimated; preflight FAIL, nothing "
                              "started", **{"steps lost": 0, "data lost": "none"})


def test_verl_survives_a_full_disk_and_the_reward_rises(verl_disk, verl_image, docker_client, fault_row):
    run = verl_disk
    res, ckpt_dir, estimate = guarded(run)
    fault_row.update(fault=f"seed 000 on verl with keep 2 + watchdog on the {kb(run['size'])} tmpfs; other data fills "
                           "the disk after global_step_4",
                     expected="the watchdog stops verl before the save that cannot fit (head exit 3); nothing "
                              "half-written, global_step_4 kept; `up` names what to free, then resumes from it")

    filler, filled = fill_when(run, lambda: 4 in complete_steps(ckpt_dir, "verl"), estimate)
    started = time.time()
    first = up(run, "guarded", "--fresh")
    filler.join(timeout=5)
    assert "bytes" in filled, "global_step_4 never completed:\n" + first.stdout[-3000:] + first.stderr[-2000:]
    assert first.returncode == 1 and "the trainer exited with code 3" in first.stdout, first.stdout[-3000:]
    events = run_events(run, res)
    armed = [e for e in events if e["event"] == "disk_watchdog_armed"]
    assert armed and armed[0]["checkpoint_bytes"] == estimate, armed
    stops = [e for e in events if e["event"] == "disk_watchdog_stop"]
    assert len(stops) == 1 and stops[0]["step"] == 5, stops  # judged on step 5's metrics, before step 6's save
    assert stops[0]["message"] in first.stdout  # `up` ends with the watchdog's own line: what to free
    end = [e for e in events if e["event"] == "run_end"][-1]
    assert end["status"] == "disk-full" and "stopped before saving" in end["error"], end
    after_stop = list_checkpoints(str(ckpt_dir), "verl")
    assert [(c.step, c.state) for c in after_stop if c.step >= 4] == [(4, "complete")], after_stop
    assert not [c for c in after_stop if c.state == "half-written"], after_stop

    filled["path"].unlink()
    stale_thread, stale = rollout_left_behind(run, res, ckpt_dir)
    second = up(run, "guarded")
    wall = time.time() - started
    stale_thread.join(timeout=5)
    SEEN.update(stale=stale, output=second.stdout, events=run_events(run, res))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert f"step {STEPS}/{STEPS}" in second.stdout and "Traceback" not in second.stdout + first.stdout

    events = run_events(run, res)
    starts = [e for e in events if e["event"] == "run_start"]
    assert len(starts) == 2 and starts[0]["resumed_from"] is None, starts
    assert starts[1]["resumed_from"].endswith("/global_step_4"), starts
    resumed = [int(e["step"]) for e in events if e["event"] == "step" and e["time"] >= starts[1]["time"]]
    assert resumed[0] == 5 and resumed[-1] == STEPS, resumed
    assert all(s["uid"] == 1000 and s["gid"] == 1000 for s in starts)  # the run user, not root

    summary = json.loads((run["cwd"] / ".grpo-deploy" / RUN / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["steps"] == STEPS, summary
    # the run's rise, from its first step: summary's first 5 are the resumed attempt's (steps 5-9), already trained
    # (a fresh CI run: 0.734 -> 0.832 there, while steps 1-5 -> 16-20 rise ~0.58 -> ~0.84); a step trained twice
    # counts with its first attempt's reward
    reward: dict[int, float] = {}
    for e in events:
        if e["event"] == "step" and "reward" in e:
            reward.setdefault(int(e["step"]), float(e["reward"]))
    first5, last5 = (sum(reward[s] for s in steps) / 5 for steps in (range(1, 6), range(STEPS - 4, STEPS + 1)))
    assert last5 > first5 + 0.1, (first5, last5, reward)  # brevity: ~0.58 -> ~0.85 seen
    assert summary["reward_last5"] == pytest.approx(last5, abs=1e-3), summary
    final = list_checkpoints(str(ckpt_dir), "verl")
    kept = [c.step for c in final if c.complete]  # verl's own pruning leaves the others' dataloader state: "pruned"
    assert kept == [STEPS - SAVE_EVERY, STEPS], [(c.step, c.state) for c in final]
    assert not [c for c in final if c.state == "half-written"], [(c.step, c.state) for c in final]
    assert len(list((on_share(run, res, res.run_dir) / "verl-metrics").glob("attempt-*.jsonl"))) == 2
    fault_row.update(observed=f"ballast {kb(filled['bytes'])} left {kb(filled['free_after'])} free; the watchdog "
                              f"stopped verl after step 5 (needs {kb(stops[0]['need_bytes'])}, "
                              f"{kb(stops[0]['free_bytes'])} free), head exit 3, global_step_4 kept, none "
                              "half-written; ballast removed, `up` resumed from global_step_4 to "
                              f"{STEPS}/{STEPS} steps, reward (steps 1-5 -> {STEPS - 4}-{STEPS}) {first5:.3f} -> "
                              f"{last5:.3f}; kept {kept} ({wall:.0f} s for both `up`s)",
                     **{"steps lost": 1, "data lost": "none"})


def rollout_left_behind(run: dict, res, ckpt_dir) -> tuple[threading.Thread, dict]:
    """A thread that arms the rollout failpoint once the resumed attempt logged step ARM_AFTER, and removes it once
    the watcher's stale-policy warning is in the metrics (or 8 steps later); the dict says at which steps."""
    flag = ckpt_dir / FAILPOINT_DIR / ROLLOUT_KEEPS_ADAPTER
    seen: dict = {"flag": flag}

    def work() -> None:
        deadline = time.time() + UP_TIMEOUT_S
        try:
            while time.time() < deadline:
                events = run_events(run, res)
                starts = [e["time"] for e in events if e["event"] == "run_start"]
                later = [e for e in events if len(starts) >= 2 and e["time"] >= starts[-1]]
                last = max([int(e["step"]) for e in later if e["event"] == "step"], default=0)
                if "armed" not in seen and last >= ARM_AFTER:
                    flag.parent.mkdir(exist_ok=True)
                    flag.touch()
                    for path in (flag.parent, flag):
                        os.chown(path, 1000, 1000)
                    seen.update(armed=last, armed_time=time.time())
                warned = [e for e in later if e["event"] == "watch" and e.get("kind") == "stale_policy"]
                if "armed" in seen and (warned or last >= seen["armed"] + 8):
                    seen.update(disarmed=last, disarmed_time=time.time())
                    return
                if any(e["event"] == "run_end" for e in later):
                    return
                time.sleep(0.3)
        finally:
            flag.unlink(missing_ok=True)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread, seen


def test_verls_rollout_left_behind_is_caught_in_one_line_and_clears(fault_row):
    """Rides on the guarded replay's resumed attempt (the test before; this one reads what it saw)."""
    fault_row.update(fault=f"verl's LoRA syncs into its colocated vLLM acknowledged but never applied from step "
                           f"{ARM_AFTER} (the rollout failpoint in the actor's ServerAdapter), then applied again",
                     expected=f"verl's rollout-vs-actor gap leaves its floor; the watcher warns in one line within "
                              f"{STALE_WITHIN} steps; cleared once syncs apply again")
    assert SEEN, "the guarded replay did not get to its resumed attempt (the test before this one failed)"
    stale, output, events = SEEN["stale"], SEEN["output"], SEEN["events"]
    assert "armed" in stale and "disarmed" in stale, stale
    starts = [e["time"] for e in events if e["event"] == "run_start"]
    checks = [e for e in events if e["event"] == "served_policy" and e.get("check") == "rollout-gap"]
    resumed = [e for e in checks if e["time"] >= starts[-1]]
    assert [e["verdict"] for e in resumed[:3]] == ["floor"] * 3, resumed[:4]  # each attempt learns its floor
    before = [e for e in checks if e["time"] < stale["armed_time"]]
    assert before and all(e["verdict"] in ("floor", "in-step") for e in before), before
    (found,) = [e for e in events if e["event"] == "watch" and e.get("kind") == "stale_policy" and e["level"] == "warn"]
    assert found["verdict"] == "rollout-gap" and ARM_AFTER < found["step"] <= stale["armed"] + STALE_WITHIN, found
    assert found["gap_mean"] > found["threshold"] >= 1e-3, found
    lines = [ln for ln in output.splitlines() if "run watcher: stale policy: verl's rollout is not sampling" in ln]
    assert len(lines) == 1, output[-3000:]
    cleared = [e for e in events if e["event"] == "watch" and e.get("kind") == "stale_policy" and e["level"] == "clear"]
    assert cleared and cleared[0]["step"] > found["step"], (cleared, checks[-6:])
    assert checks[-1]["verdict"] == "in-step", checks[-3:]
    floor = max(e["gap_mean"] for e in before)
    fault_row.update(observed=f"armed after step {stale['armed']}; warned at step {found['step']} (mean gap "
                              f"{found['gap_mean']:.3g}, max {found['gap_max']:.3g}; healthy steps at most "
                              f"{floor:.3g}, threshold {found['threshold']:.3g}); removed after step "
                              f"{stale['disarmed']}, cleared at step {cleared[0]['step']}; {STEPS}/{STEPS} steps",
                     **{"steps lost": 0, "data lost": "none"})
