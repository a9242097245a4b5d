"""Fault: seed 000 replayed — the A100 run whose disk filled while its step-80 checkpoint was written (save every 20
of 105 steps: three checkpoints fitted, the 4th did not). Scaled to the rehearsal: a save every 2 of 8 steps into a
real tmpfs, mounted by the test and given to the spec as hosts[].shared_dir, sized by the plan's own estimate to hold
three checkpoints but not four (3.5, as the seed's disk). The real trainer and its real saves, in the real containers.

Without retention and the watchdog (keep all, watchdog off), the seed's configuration: `plan` on that filesystem
names the failing save, preflight refuses to start it, and the same stack started past preflight (the kit's render,
its compose project) fails with ENOSPC at exactly that save, leaving the seed's half-written checkpoint.

With them (keep 2, watchdog on): the volume holds the run; then other data fills the disk after step 4 (as the
seed's root volume filled): the watchdog stops the run before the save that cannot fit, nothing is half-written, the
newest complete checkpoint survives; `up` resumes from it and retention still keeps 2 after the resume."""

from __future__ import annotations

import time

import pytest

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.deploy import lifecycle as deploy
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.hosts.connect import SshOptions
from grpo_deploy.runtime.storage.checkpoints import list_checkpoints
from tests import compose
from tests.faults.replay_disk import (
    SEED_FAILING_SAVE,
    UP_TIMEOUT_S,
    fill_when,
    free_bytes,
    guarded,
    kb,
    on_share,
    plan_names_the_save_and_preflight_refuses,
    resolved,
    run_events,
    seed_tmpfs,
    up,
)

RUN = "replay"
SAVE_EVERY, MAX_STEPS = 2, 8  # the seed saved every 20 of 105 steps and failed at the 4th save: here step 8
# How a full disk reads in the trainer's error: OSError errno 28, or torch's zip writer failing mid-file.
ENOSPC_WORDS = ("No space left on device", "Errno 28", "file write failed", "unexpected pos")


@pytest.fixture()
def seed_disk(tmp_path, docker_client):
    with seed_tmpfs(tmp_path, "trl-async", RUN, SAVE_EVERY, {"trl": {"max_steps": MAX_STEPS}}) as run:
        yield run


def test_seed000_without_retention_plan_names_the_save_that_fails(seed_disk, cpu_image, docker_client, fault_row):
    run = seed_disk
    res = resolved(run["seed"])
    fault_row.update(fault=f"seed 000 replayed: keep all, watchdog off, a save every {SAVE_EVERY} of {MAX_STEPS} steps "
                           f"into a {kb(run['size'])} tmpfs (holds 3 checkpoints, not 4)",
                     expected="plan names the failing save; preflight refuses to start; started anyway, the real run "
                              "fails with ENOSPC at that same save")
    disk = plan_names_the_save_and_preflight_refuses(run, docker_client, SAVE_EVERY, RUN)
    predicted = disk["fails_at_step"]

    # The seed's user had no preflight: the same render and compose project, started past it.
    dep = Deployment(res, SshOptions())
    deploy.put_render(dep, {})
    project = dep.project("local")
    started = time.time()
    try:
        project.up("server")
        project.up("trainer")
        deadline = time.time() + UP_TIMEOUT_S
        trainer = compose.containers(docker_client, RUN, "trainer")[0]
        while time.time() < deadline:
            trainer.reload()
            if trainer.status in ("exited", "dead"):
                break
            time.sleep(2)
        exit_code = trainer.attrs["State"].get("ExitCode")
        logs = trainer.logs(tail=300).decode(errors="replace")
    finally:
        project.down()
    wall = time.time() - started
    events = run_events(run, res)
    # run_end is in metrics.jsonl, or (when the full disk refused that line too) in the trainer's log, via stderr
    spilled = [line[line.index("{"):] for line in logs.splitlines() if line.startswith("metrics: not written")]
    end = [e for e in events + parse_events("\n".join(spilled)) if e["event"] == "run_end"]
    assert exit_code == 1 and end and end[-1]["status"] == "error", (exit_code, end, logs[-3000:])
    said = (end[-1]["error"] or "") + logs
    assert any(m in said for m in ENOSPC_WORDS), (end[-1], logs[-3000:])
    assert free_bytes(run["share"]) < disk["checkpoint_bytes"], free_bytes(run["share"])  # the disk really is full
    found = list_checkpoints(str(on_share(run, res, res.checkpoint_dir)), "trl")
    half = [c.step for c in found if c.state == "half-written"]
    complete = [c.step for c in found if c.complete]
    assert half == [predicted], [(c.step, c.state, c.size_bytes) for c in found]  # the real failure: same save
    assert complete == list(range(SAVE_EVERY, predicted, SAVE_EVERY)), complete
    real = max(c.size_bytes for c in found if c.complete)
    assert not any(e["event"].startswith("disk_watchdog") for e in events)  # off, as in the seed
    fault_row.update(observed=f"plan: {SEED_FAILING_SAVE}th save (step {predicted}) fails, "
                              f"{kb(disk['checkpoint_bytes'])} per checkpoint estimated (largest real "
                              f"{kb(real)}); preflight FAIL, nothing started; "
                              f"started past it: ENOSPC at the save of step {half[0]} (exit {exit_code}, "
                              f"{wall:.0f} s), checkpoint-{half[0]} half-written, {complete} complete",
                     **{"steps lost": predicted - complete[-1],
                        "data lost": f"checkpoint-{half[0]} (half-written, as in the seed)"})


def test_seed000_with_retention_and_watchdog_nothing_half_written_resume_picks_newest(seed_disk, cpu_image,
                                                                                      docker_client, fault_row):
    run = seed_disk
    res, ckpt_dir, estimate = guarded(run)
    fault_row.update(fault=f"seed 000 replayed with keep 2 + watchdog on the {kb(run['size'])} tmpfs; other data "
                           "fills the disk after the step-4 save",
                     expected="the run fits with retention; the watchdog stops it before the save that cannot fit; "
                              "nothing half-written, newest complete kept; `up` resumes from it, keep 2 after resume")
    filler, filled = fill_when(run, lambda: (ckpt_dir / "checkpoint-4" / "trainer_state.json").exists(), estimate)
    started = time.time()
    first = up(run, "guarded", "--fresh")
    filler.join(timeout=5)
    assert "bytes" in filled, "checkpoint-4 never completed:\n" + first.stdout[-3000:]
    assert first.returncode == 1 and "the trainer exited with code 1" in first.stdout, first.stdout[-3000:]
    events = run_events(run, res)
    armed = [e for e in events if e["event"] == "disk_watchdog_armed"]  # emitted only by this checkout's runtime
    assert armed and armed[0]["checkpoint_bytes"] == estimate, armed
    stops = [e for e in events if e["event"] == "disk_watchdog_stop"]
    assert len(stops) == 1 and stops[0]["step"] == 6, stops
    end = [e for e in events if e["event"] == "run_end"][-1]
    assert end["status"] == "disk-full" and "stopped before saving" in end["error"], end
    after_stop = list_checkpoints(str(ckpt_dir), "trl")
    assert [(c.step, c.state) for c in after_stop] == [(2, "complete"), (4, "complete")], after_stop
    assert not (ckpt_dir / "quarantine").exists() and not (ckpt_dir / "checkpoint-6").exists()

    filled["path"].unlink()
    second = up(run, "guarded")
    wall = time.time() - started
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    events = run_events(run, res)
    starts = [e for e in events if e["event"] == "run_start"]
    assert len(starts) == 2 and starts[-1]["resumed_from"] == f"{res.checkpoint_dir}/checkpoint-4", starts
    assert not [e for e in events if e["event"] == "checkpoint_quarantine"]  # nothing half-written, ever
    assert max(int(e["step"]) for e in events if e["event"] == "step") == MAX_STEPS
    final = list_checkpoints(str(ckpt_dir), "trl")
    assert [(c.step, c.state) for c in final] == [(6, "complete"), (8, "complete")], final  # keep 2 after resume
    assert not (ckpt_dir / "quarantine").exists()
    fault_row.update(observed=f"fits with keep 2 (peak 3 checkpoints); ballast {kb(filled['bytes'])} left "
                              f"{kb(filled['free_after'])} free; watchdog stopped before the step-6 save (needs "
                              f"{kb(stops[0]['need_bytes'])}, {kb(stops[0]['free_bytes'])} free); checkpoints 2, 4 "
                              f"complete, none half-written; ballast removed, `up` resumed from checkpoint-4 to "
                              f"{MAX_STEPS}/{MAX_STEPS}; kept 6, 8 ({wall:.0f} s in all)",
                     **{"steps lost": stops[0]["step"] - 4, "data lost": "none"})
