"""Plan a run (pure): what runs where, memory fit, checkpoint size, the save schedule, and disk need vs free space.

Memory is the engine's answer per role on each host (`memory`); a side that does not fit carries `short` (which side,
need vs available, by how much) and `fix`: memory_shortfalls gives those lines, for `plan` and preflight's memory check.
plan_text is the `plan` verb's text (the CLI only prints it).

Free space is an input (a fact gathered by the caller from the real filesystem, or a what-if figure), so
every number here is reproducible in tests. Estimates are labelled as such; the disk rule is exact given
the checkpoint size: while a checkpoint is written the previous `keep` still exist, so the peak is
(keep + 1) checkpoints + the adapters the server may still read + a safety margin.

The schedule is closed-form (O(log) in the step count, never a walk over steps or saves): the saves are every
`save_every` steps (plus the last step where the engine saves it), a checkpoint grows by a fixed number of bytes per
logged step (the engine's checkpoint_growth), so the bytes of any run of consecutive saves are a floor sum; the save
that runs out of disk is found by bisection. Every size is an integer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_deploy.architecture import Architecture
from grpo_deploy.common.table import human_bytes, table
from grpo_deploy.engines.base import GB, human
from grpo_deploy.spec.resolve import Resolved, as_dict


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
    save_steps: list[int]  # the first saves and the last (SHOWN_SAVES at most): save_count says how many in all
    keep: int | None
    peak_bytes: int
    fits: bool | None
    fails_at_save: int | None = None  # 1-based index into save_steps
    fails_at_step: int | None = None
    recommended_keep: int | None = None
    extra_needed_bytes: int | None = None
    explanation: list[str] = field(default_factory=list)
    save_count: int = 0


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
    objective: str = ""
    """How the loss weights tokens and answers (the engine's loss_objective): named before the run."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def total_steps(res: Resolved) -> int:
    return res.engine_info.total_steps(res)


SHOWN_SAVES = 12


@dataclass(frozen=True)
class Schedule:
    """The saves of a run in closed form: `regular` saves at every, 2*every, ...; plus one at the last step when the
    engine saves it (verl) and it is not a multiple of every."""

    every: int
    steps: int
    regular: int
    last: bool

    @property
    def count(self) -> int:
        return self.regular + self.last

    def step(self, i: int) -> int:
        """The step of save *i* (1-based)."""
        return i * self.every if i <= self.regular else self.steps

    def sample(self, n: int = SHOWN_SAVES) -> list[int]:
        """The first saves and the last, n at most."""
        if self.count <= n:
            return [self.step(i) for i in range(1, self.count + 1)]
        return [self.step(i) for i in range(1, n)] + [self.step(self.count)]


def schedule(res: Resolved, steps: int) -> Schedule:
    every = res.settings.checkpoints.save_every
    if not every or every <= 0 or steps <= 0:
        return Schedule(1, max(steps, 0), 0, False)
    regular = steps // every
    return Schedule(every, steps, regular, bool(res.engine_info.saves_last_step and steps % every))


def save_steps(res: Resolved, steps: int) -> list[int]:
    """Every save step (a list: for small runs and tests; plan itself uses schedule)."""
    sched = schedule(res, steps)
    return [sched.step(i) for i in range(1, sched.count + 1)]


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum(floor((a*i + b) / m) for i in range(n)), for n, m >= 1 and a, b >= 0, in O(log) steps."""
    total = 0
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b, m, a = y_max // m, y_max % m, a, m


class _Sizes:
    """Bytes of runs of consecutive saves: size(step) = base + growth * (step // interval), summed in closed form."""

    def __init__(self, sched: Schedule, base: int, growth: int, interval: int):
        self.sched, self.base, self.growth, self.interval = sched, base, growth, max(interval, 1)

    def of(self, step: int) -> int:
        return self.base + self.growth * (step // self.interval)

    def window(self, lo: int, hi: int) -> int:
        """Bytes of saves lo..hi (1-based, inclusive)."""
        if hi < lo:
            return 0
        total, sched = 0, self.sched
        top = min(hi, sched.regular)
        if top >= lo:
            logs = (floor_sum(top + 1, self.interval, sched.every, 0) - floor_sum(lo, self.interval, sched.every, 0))
            total += (top - lo + 1) * self.base + self.growth * logs
        if hi > sched.regular:
            total += self.of(sched.steps)
        return total


def checkpoint_bytes(res: Resolved, arch: Architecture, step: int | None = None) -> tuple[int, int, list[str]]:
    """(checkpoint size, adapter size, explanation lines) of the checkpoint written at *step* (default: the run's last
    step, the largest one where checkpoints grow): the engine's answer."""
    return res.engine_info.checkpoint_bytes(res, arch, step)


def plan_disk(res: Resolved, arch: Architecture, free_bytes: int | None, filesystem: str, free_source: str) -> DiskPlan:
    ckpt, adapter, why = checkpoint_bytes(res, arch)
    steps = total_steps(res)
    sched = schedule(res, steps)
    keep = res.keep
    adapters_kept = res.engine_info.adapters_kept(res)
    margin = int(res.settings.checkpoints.disk_margin_gb * GB)
    fixed = adapter * adapters_kept + margin
    # TRL checkpoints grow a little with every save (trainer_state.json's log history): each save has its own size
    growth, interval = res.engine_info.checkpoint_growth(res)
    sizes = _Sizes(sched, checkpoint_bytes(res, arch, 0)[0], growth, interval)

    def present_while_saving(i: int, k: int | None) -> int:  # checkpoints on disk while save i (1-based) is written
        return i if k is None else min(i - 1, k) + 1

    def bytes_while_saving(i: int, k: int | None) -> int:  # the newest of them are kept: sum their sizes
        return sizes.window(i - present_while_saving(i, k) + 1, i)

    n_saves = sched.count
    saves = sched.sample()
    peak = (bytes_while_saving(n_saves, keep) if n_saves else 0) + fixed
    plan = DiskPlan(filesystem=filesystem, free_bytes=free_bytes, free_source=free_source, checkpoint_bytes=ckpt,
                    adapter_bytes=adapter, adapters_kept=adapters_kept, margin_bytes=margin, total_steps=steps,
                    save_steps=saves, keep=keep, peak_bytes=peak, fits=None, explanation=list(why),
                    save_count=n_saves)
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
    lo, hi = 1, n_saves  # the first save that does not fit (bytes while saving never shrink from one save to the next)
    while lo < hi:
        mid = (lo + hi) // 2
        if bytes_while_saving(mid, keep) + fixed > free_bytes:
            hi = mid
        else:
            lo = mid + 1
    if n_saves and bytes_while_saving(lo, keep) + fixed > free_bytes:
        plan.fails_at_save, plan.fails_at_step = lo, sched.step(lo)
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


def role_plans(res: Resolved) -> list[RolePlan]:
    """What runs where and each role's memory, host by host (no fact of any host needed)."""
    arch = Architecture.from_dict(res.architecture) if res.architecture else None
    engine = res.engine_info
    return [RolePlan(host.name, host.address, res.profiles[host.name].name, engine.roles_words(res, host),
                     engine.gpu_words(res, host), _memory(res, arch, host)) for host in res.spec.hosts]


@dataclass(frozen=True)
class Shortfall:
    """A role whose memory does not fit on its host: what is short by how much, and what to change."""

    host: str
    role: str
    short: str
    fix: str

    def line(self) -> str:
        return f"memory on {self.host}: {self.short} -> fix: {self.fix}"


def memory_shortfalls(hosts: list[RolePlan]) -> list[Shortfall]:
    """One per role that does not fit, in host order."""
    return [Shortfall(h.host, m.get("role", "?"), m.get("short") or f"{m.get('role')} does not fit: {m.get('why')}",
                      m.get("fix", "see grpo-deploy plan"))
            for h in hosts for m in h.memory if m.get("fits") is False]


def make_plan(res: Resolved, free_bytes: int | None = None, filesystem: str = "?",
              free_source: str = "unknown") -> Plan:
    arch = Architecture.from_dict(res.architecture) if res.architecture else None
    warnings = []
    hosts = role_plans(res)
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
                hosts=hosts, disk=disk, settings=as_dict(res), warnings=warnings, ok=ok,
                objective=res.engine_info.loss_objective(res))


def plan_text(plan: Plan, forecast: str, explain: bool = False) -> str:
    """`grpo-deploy plan`'s text: the run, the memory table and its shortfalls, the disk, *forecast* (the forecast as
    forecast.forecast_text gives it), the warnings, and with *explain* every setting with its source and why."""
    lines = [f"run {plan.run}: engine {plan.engine}, model {plan.model}"
             + (f" ({plan.params / 1e6:,.1f} M params, LoRA {plan.lora_params / 1e6:,.2f} M)" if plan.params else "")]
    rows = []
    for h in plan.hosts:
        for m in h.memory:
            detail = ", ".join(f"{k}={v}" for k, v in m.items() if k not in ("role", "why", "fits", "short", "fix"))
            rows.append([h.host, h.profile, m.get("role"), h.gpus,
                         {True: "fits", False: "DOES NOT FIT", None: "?"}[m.get("fits")],
                         f"{detail}. {m.get('why', '')}"])
    lines.append(table(["host", "profile", "role", "gpus", "memory", "estimate"], rows))
    lines += [short.line() for short in memory_shortfalls(plan.hosts)]
    if plan.disk:
        d = plan.disk
        lines.append("")
        lines.append(f"checkpoints: {human_bytes(d.checkpoint_bytes)} each, saved at steps "
                     f"{_saves_text(d)} of {d.total_steps}; keep "
                     f"{'all' if d.keep is None else d.keep}; adapters on the volume {d.adapters_kept} x "
                     f"{human_bytes(d.adapter_bytes)}")
        lines.append(f"disk: need {human_bytes(d.peak_bytes)} at peak on {d.filesystem}; free "
                     f"{human_bytes(d.free_bytes)} ({d.free_source}) -> "
                     + {True: "OK", False: "DOES NOT FIT", None: "unknown"}[d.fits])
        lines += [f"  - {line}" for line in d.explanation]
    lines += ["", forecast]
    lines += [f"warning: {w}" for w in plan.warnings]
    if explain:
        rows = [[f"{section}.{k}", v["value"], v["source"], v["why"]]
                for section, values in plan.settings.items() for k, v in values.items()]
        lines += ["", table(["setting", "value", "from", "why"], rows)]
    else:
        lines.append("\n(--explain lists every setting with where it came from and why)")
    return "\n".join(lines)


def _saves_text(d: DiskPlan) -> str:
    if d.save_count <= len(d.save_steps):
        return ", ".join(map(str, d.save_steps)) or "never"
    return f"{', '.join(map(str, d.save_steps[:-1]))}, ... {d.save_steps[-1]} ({d.save_count} saves)"
