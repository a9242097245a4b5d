"""What the seed-000 replay (tests/faults/test_disk_full_replay.py) found, pinned without containers: plan's TRL
checkpoint estimate against a real rehearsal checkpoint's files, per-save sizes, the share a one-off container
mounts, the run's own checkpoints counted as free on a resume, and the watchdog's armed event."""

from __future__ import annotations

import os

import yaml
from transformers import TrainerControl, TrainerState

from grpo_deploy import plan, preflight, spec
from grpo_deploy.engines import trl_sizes
from grpo_deploy.hosts import oneoff
from grpo_deploy.preflight import session
from grpo_deploy.runtime.storage.disk_space import DiskWatchdogConfig
from grpo_deploy.runtime.trainer.disk_watchdog import DiskWatchdog
from grpo_deploy.spec import resolve
from tests.specs import spec_data, spec_yaml

# checkpoint-2 of the rehearsal (tiny-qwen2, LoRA r8 all-linear; transformers 5.24, TRL 1.16, PEFT 0.21), as listed
# on its volume: file sizes in bytes. On a 4 KiB-block filesystem it occupies 487,424 B.
REHEARSAL_CHECKPOINT_2 = {
    "README.md": 5222, "adapter_config.json": 1607, "adapter_model.safetensors": 134608, "chat_template.jinja": 207,
    "optimizer.pt": 285723, "rng_state.pth": 14327, "rollout_state.json": 39, "scheduler.pt": 1465,
    "tokenizer.json": 3496, "tokenizer_config.json": 580, "trainer_state.json": 5872, "training_args.bin": 6033,
}
TRAINER_STATE_AT = {2: 5872, 4: 11339, 6: 16720}  # its log_history grows with every logged step


def _res(**changes):
    return resolve.resolve(spec.loads(spec_yaml("cpu", hosts=(), **changes)))


def _blocks(n: int) -> int:
    return -(-n // 4096) * 4096


def test_trl_estimate_brackets_a_real_rehearsal_checkpoint():
    res = _res(**{"checkpoints.save_every": 2, "overrides": {"trl": {"max_steps": 8}}})
    arch = plan.Architecture.from_dict(res.architecture)
    estimate = plan.checkpoint_bytes(res, arch, 2)[0]
    apparent = sum(REHEARSAL_CHECKPOINT_2.values())
    allocated = sum(_blocks(n) for n in REHEARSAL_CHECKPOINT_2.values())
    assert apparent <= allocated <= estimate <= 1.15 * apparent  # was 8.8 MB: 19 times the real 459 KB
    assert len(REHEARSAL_CHECKPOINT_2) == trl_sizes.TRL_CHECKPOINT_FILES
    grow = [trl_sizes.checkpoint_parts(res, arch, s)["trainer_state"] for s in TRAINER_STATE_AT]
    assert all(real <= est <= real + 3000 for real, est in zip(TRAINER_STATE_AT.values(), grow, strict=True)), grow


def test_qwen_tokenizer_keeps_a_gpu_checkpoint_in_megabytes():
    res = resolve.resolve(spec.loads(spec_yaml("gb10")))
    arch = plan.Architecture.from_dict(res.architecture)
    parts = trl_sizes.checkpoint_parts(res, arch, 500)
    assert 7e6 < parts["tokenizer"] < 8e6  # Qwen2.5's tokenizer.json: 7.03 MB


def test_the_seed_scenario_fails_at_the_4th_save_from_per_save_sizes():
    res = _res(**{"checkpoints.save_every": 2, "checkpoints.keep": "all", "checkpoints.disk_margin_gb": 0.0,
                  "overrides": {"trl": {"max_steps": 8}}})
    arch = plan.Architecture.from_dict(res.architecture)
    sizes = [plan.checkpoint_bytes(res, arch, s)[0] for s in (2, 4, 6, 8)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    d0 = plan.make_plan(res, free_bytes=10**9).disk
    fixed = d0.adapter_bytes * d0.adapters_kept
    just_three = fixed + sum(sizes[:3])
    d = plan.make_plan(res, free_bytes=just_three).disk
    assert (d.fails_at_save, d.fails_at_step) == (4, 8) and d.peak_bytes == fixed + sum(sizes)
    assert plan.make_plan(res, free_bytes=just_three - 1).disk.fails_at_step == 6
    assert "KB per checkpoint" in " ".join(d.explanation)  # not "0.0 GB"


def _share(res):
    return oneoff.share_source(res, res.host_for(res.engine_info.main_role))


def test_share_source_is_what_compose_mounts(tmp_path):
    share = tmp_path / "share"
    assert _share(_res()) == ("grpo-deploy-shared", None)
    assert _share(_res(**{"hosts.0.shared_dir": str(share)})) == (str(share), None)
    nfs = _res(**{"storage.nfs": {"server": "10.0.0.5", "export": "/export/grpo"}})
    volume, opts = _share(nfs)
    assert volume == "grpo-deploy-shared"
    assert opts == {"type": "nfs", "o": "addr=10.0.0.5,nfsvers=4.1,hard,lookupcache=positive",
                    "device": ":/export/grpo"}


def test_preflight_probes_mount_what_compose_mounts_when_nfs_and_shared_dir_are_both_set(tmp_path):
    both = _res(**{"storage.nfs": {"server": "10.0.0.5", "export": "/export/grpo"},
                   "hosts.0.shared_dir": str(tmp_path / "share")})
    args = oneoff.share_args(both, both.host_for("trainer"))
    assert args[0] == "--mount" and "volume-opt=type=nfs" in args[1] and str(tmp_path) not in " ".join(args)


def test_a_resume_counts_the_runs_own_checkpoints_as_free(tmp_path, monkeypatch):
    share = tmp_path / "share"
    data = spec_data("cpu", "trl-async", (), **{"hosts.0.shared_dir": str(share)})
    res = resolve.resolve(spec.loads(yaml.safe_dump(data)))
    ckpt = share / os.path.relpath(res.checkpoint_dir, res.spec.storage.mount)
    (ckpt / "checkpoint-20").mkdir(parents=True)
    (ckpt / "checkpoint-20" / "optimizer.pt").write_bytes(b"o" * 10**6)
    (ckpt / "quarantine" / "checkpoint-40").mkdir(parents=True)
    (ckpt / "quarantine" / "checkpoint-40" / "optimizer.pt").write_bytes(b"q" * 3 * 10**6)
    measured = preflight.measured_free_space(preflight.Context(res))
    raw = measured[0]
    # the filesystem's free space, read once: another job writing to the same disk between two reads is not the kit
    monkeypatch.setattr(session, "measured_free_space", lambda ctx: measured)
    free, where, how = preflight.checkpoint_free_space(preflight.Context(res))
    assert 10**6 <= free - raw < 10**6 + 3 * 4096 + 8192  # the checkpoint, not the quarantined one
    assert "this run's own checkpoints" in how
    assert preflight.checkpoint_headroom(preflight.Context(res))["free_bytes"] <= raw + 4096  # status: what is free
    monkeypatch.undo()
    given = preflight.checkpoint_free_space(preflight.Context(res, free_space={"local": 123}))
    assert given[0] == 123  # a what-if figure is taken as given


def test_the_watchdog_announces_its_estimate_at_the_start(tmp_path):
    events = []
    watchdog = DiskWatchdog(str(tmp_path), DiskWatchdogConfig(checkpoint_bytes=543_000, margin_bytes=7),
                            lambda e, **f: events.append((e, f)), free=lambda _: 2_000_000)
    watchdog.on_train_begin(None, TrainerState(), TrainerControl())
    assert events == [("disk_watchdog_armed", {"checkpoint_bytes": 543_000, "margin_bytes": 7,
                                               "free_bytes": 2_000_000})]
