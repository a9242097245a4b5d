"""Plan a run (pure): what runs where, memory fit, checkpoint size, the save schedule, and disk need vs free space.

Free space is an input (a fact gathered by the caller from the real filesystem, or a what-if figure), so
every number here is reproducible in tests. Estimates are labelled as such; the disk rule is exact given
the checkpoint size: while a checkpoint is written the previous `keep` still exist, so the peak is
(keep + 1) checkpoints + the adapters the server may still read + a safety margin.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .architecture import Architecture
from .engines.base import GB, human
from .resolve import Resolved, as_dict


@dataclass
class DiskPlan:
    filesystem: str
    free_bytes: int | None
    free_source: str
    checkpoint_bytes: int
    adapter_bytes: int
    adapters_kept: int
    margin_bytes: int
    total_steps: int
    save_steps: list[int]
    keep: int | None
    peak_bytes: int
    fits: bool | None
    fails_at_save: int | None = None  # 1-based index into save_steps
    fails_at_step: int | None = None
    recommended_keep: int | None = None
    extra_needed_bytes: int | None = None
    explanation: list[str] = field(default_factory=list)


@dataclass
class RolePlan:
    host: str
    address: str
    profile: str
    roles: list[str]
    gpus: str
    memory: list[dict[str, Any]]


@dataclass
class Plan:
    run: str
    engine: str
    model: str
    params: int | None
    lora_params: int | None
    hosts: list[RolePlan]
    disk: DiskPlan | None
    settings: dict[str, dict[str, Any]]
    warnings: list[str]
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def total_steps(res: Resolved) -> int:
    return res.engine_info.total_steps(res)


def save_steps(res: Resolved, steps: int) -> list[int]:
    every = res.settings.checkpoints.save_every
    if not every or every <= 0 or steps <= 0:
        return []
    out = list(range(every, steps + 1, every))
    if res.engine_info.saves_last_step and steps not in out:
        out.append(steps)  # verl also saves on the last step
    return out


def checkpoint_bytes(res: Resolved, arch: Architecture, step: int | None = None) -> tuple[int, int, list[str]]:
    """(checkpoint size, adapter size, explanation lines) of the checkpoint written at *step* (default: the run's last
    step, the largest one where checkpoints grow): the engine's answer."""
    return res.engine_info.checkpoint_bytes(res, arch, step)


def plan_disk(res: Resolved, arch: Architecture, free_bytes: int | None, filesystem: str, free_source: str) -> DiskPlan:
    ckpt, adapter, why = checkpoint_bytes(res, arch)
    steps = total_steps(res)
    saves = save_steps(res, steps)
    keep = res.keep
    adapters_kept = res.engine_info.adapters_kept(res)
    margin = int(res.settings.checkpoints.disk_margin_gb * GB)
    fixed = adapter * adapters_kept + margin
    # TRL checkpoints grow a little with every save (trainer_state.json's log history): each save has its own size
    sizes = [checkpoint_bytes(res, arch, step)[0] for step in saves]

    def present_while_saving(i: int, k: int | None) -> int:  # checkpoints on disk while save i (1-based) is written
        return i if k is None else min(i - 1, k) + 1

    def bytes_while_saving(i: int, k: int | None) -> int:  # the newest of them are kept: sum their sizes
        return sum(sizes[i - present_while_saving(i, k):i])

    n_saves = len(saves)
    peak = (bytes_while_saving(n_saves, keep) if n_saves else 0) + fixed
    plan = DiskPlan(filesystem=filesystem, free_bytes=free_bytes, free_source=free_source, checkpoint_bytes=ckpt,
                    adapter_bytes=adapter, adapters_kept=adapters_kept, margin_bytes=margin, total_steps=steps,
                    save_steps=saves, keep=keep, peak_bytes=peak, fits=None, explanation=list(why))
    plan.explanation.append(
        f"{n_saves} saves over {steps} steps (every {res.settings.checkpoints.save_every}), keep "
        f"{'all' if keep is None else keep}: peak {present_while_saving(n_saves, keep) if n_saves else 0} checkpoints "
        f"while one is written + {adapters_kept} adapters + {human(margin)} margin = {human(peak)}")
    if free_bytes is None:
        plan.explanation.append("free space unknown: measured by preflight on the host that holds the volume")
        return plan
    plan.fits = peak <= free_bytes
    if plan.fits:
        return plan
    for i, step in enumerate(saves, start=1):
        if bytes_while_saving(i, keep) + fixed > free_bytes:
            plan.fails_at_save, plan.fails_at_step = i, step
            break
    best = int((free_bytes - fixed) // ckpt) - 1 if ckpt else None
    plan.recommended_keep = best if best is not None and best >= 1 else None
    keep_all_peak = (bytes_while_saving(n_saves, None) if n_saves else 0) + fixed
    plan.extra_needed_bytes = max(0, keep_all_peak - free_bytes)
    ordinal = {1: "1st", 2: "2nd", 3: "3rd"}.get(plan.fails_at_save or 0, f"{plan.fails_at_save}th")
    msg = (f"the run runs out of disk at the {ordinal} save (step {plan.fails_at_step}): "
           f"{human(free_bytes)} free on {filesystem}, {human(ckpt)} per checkpoint")
    plan.explanation.append(msg)
    if plan.recommended_keep:
        plan.explanation.append(
            f"set checkpoints.keep: {plan.recommended_keep} (the largest that fits: a save needs room for one more "
            f"checkpoint before the oldest is deleted), or add {human(plan.extra_needed_bytes)} to keep all")
    else:
        plan.explanation.append(f"not even one checkpoint plus the next fits: add at least "
                                f"{human(2 * ckpt + fixed - free_bytes)} or move checkpoints.dir")
    return plan


def _memory(res: Resolved, arch: Architecture | None, host) -> list[dict[str, Any]]:
    profile = res.profiles[host.name]
    hw = profile.hardware
    cap = float(hw.get("memory_gb_per_gpu") or hw.get("host_memory_gb") or 0) * GB
    out: list[dict[str, Any]] = []
    if arch is None:
        return [{"role": ",".join(host.roles), "note": "model architecture unknown: set model.architecture"}]
    for role in host.roles:
        estimate = res.engine_info.memory(res, arch, host, role, cap)
        if estimate is not None:
            out.append(estimate)
    return out


def make_plan(res: Resolved, free_bytes: int | None = None, filesystem: str = "?",
              free_source: str = "unknown") -> Plan:
    arch = Architecture.from_dict(res.architecture) if res.architecture else None
    warnings = []
    hosts = []
    for host in res.spec.hosts:
        profile = res.profiles[host.name]
        gpus = "none" if profile.accelerator == "none" else \
            "; ".join(f"{role} {','.join(map(str, ids))}" for role, ids in res.engine_info.gpu_split(res, host).items())
        hosts.append(RolePlan(host.name, host.address, profile.name, list(host.roles), gpus, _memory(res, arch, host)))
    disk = None
    if arch is None:
        warnings.append(f"model {res.settings.model.path!r} is not in grpo_deploy/models.yaml: set model.architecture "
                        "in the spec for memory and checkpoint estimates")
    else:
        disk = plan_disk(res, arch, free_bytes, filesystem, free_source)
    ok = all(m.get("fits", True) for h in hosts for m in h.memory) and (disk is None or disk.fits is not False)
    return Plan(run=res.spec.run.name, engine=res.engine, model=res.settings.model.path,
                params=arch.params() if arch else None,
                lora_params=(arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules)
                             if arch else None),
                hosts=hosts, disk=disk, settings=as_dict(res), warnings=warnings, ok=ok)
