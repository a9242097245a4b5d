"""The engine interface: what every training engine is (its roles, the image each runs, the settings sections it reads,
which role's profile supplies what, its knobs as data: TuneKnob) and does, under the same method names in every engine
(derive, config files, per-host files, k8s params, GPU split, memory, checkpoint layout and size, total steps), with
the table of what it does not support yet and why. The deployer calls these methods; it never asks which engine a run
uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_deploy.architecture import Architecture
from grpo_deploy.names import COMPOSE_BIND, COMPOSE_NFS
from grpo_deploy.runtime.tasks.rewards import LENGTH_REWARDS
from grpo_deploy.runtime.watch.config import CAP_SHARE_AUTO

Resolved = Any
"""grpo_deploy.spec.resolve.Resolved, which the engines are given but never import (resolve imports the engines)."""
GB = 1e9
# The sections every engine reads (the model, its adapter, the data, checkpoints); an engine adds its own.
COMMON_SECTIONS = ("model", "lora", "data", "checkpoints")


def human(n: float) -> str:
    """A size in bytes as GB (2 decimals), MB or KB (1 decimal), or B."""
    for unit, size in (("GB", GB), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.{1 if unit != 'GB' else 2}f} {unit}"
    return f"{int(n)} B"


class Unsupported(RuntimeError):
    """A feature the engine does not support yet; the message is the engine's one-line reason."""


@dataclass(frozen=True)
class ClusterPorts:
    """The fixed ports of one cluster across hosts (preflight checks them free, then reachable between the nodes)."""

    what: str
    """Whose ports, in words: `Ray's`, `the trainer's rendezvous`."""
    first: tuple[int, ...]
    """Ports the first node (Ray's head, the trainer's machine 0) listens on."""
    others: tuple[int, ...] = ()
    """Ports every other node listens on."""
    ranges: tuple[tuple[int, int], ...] = ()
    """Port ranges every node keeps free (Ray's worker processes)."""
    reach_first: tuple[int, ...] = ()
    """Ports every node must reach on the first."""
    reach_all: tuple[int, ...] = ()
    """Ports every node must reach on every other node."""

    def listened(self, first: bool) -> tuple[int, ...]:
        return self.first if first else self.others


SIDES = ("trainer", "generation", "weight-sync")
"""The bottleneck sides a TuneKnob relieves (`diagnose` names the run's)."""


@dataclass(frozen=True)
class TuneKnob:
    """A knob of the engine, as data: what `grpo-deploy tune` tries one value at a time against the repeated baseline
    (grpo_deploy.tune), and, where it has one, plan's what-if of it (grpo_deploy.forecast)."""

    name: str
    """Short id for `tune --knobs` (`packing`)."""
    setting: str
    """The spec key as written in grpo-deploy.yaml (`overrides.trl.token_budget`; `hosts[server].replicas`: every host
    with role server); grpo_deploy.tune.knobs.apply_knob writes a value there."""
    side: str
    """The bottleneck side it relieves: one of SIDES."""
    candidates: Callable[[Resolved], tuple]
    """The values to try for this spec's hardware and profile, never its current value; () where the knob does not
    apply (no GPU, a switch already on, no room for more)."""
    objective: str
    """"" when the knob leaves what the loss computes unchanged; else one line on how it changes it (a faster trial of
    such a knob is kept only when the user allows it)."""
    why: str
    """One line: what it does, with the field figure."""
    what_if: Callable[[Resolved], tuple[str, str, str, bool, int] | None] | None = None
    """Plan's what-if: *what_if*(res) is (current, proposed, reference key, invert, extra GPUs); the factor is the
    profile's reference figure under that key (inverted when the change goes the other way). None: not in plan's
    table."""
    label: str = ""
    """The knob's name in plan's what-if table; "" = name."""

    def __post_init__(self) -> None:
        if self.side not in SIDES:
            raise ValueError(f"knob {self.name}: side {self.side!r} is not one of {', '.join(SIDES)}")


@dataclass(frozen=True)
class RestartWords:
    """How `up` names a role that died mid-run and what its restart starts again (grpo_deploy.deploy.supervise says
    them); a role not named here is the trainer."""

    died: dict[str, str] = field(default_factory=dict)
    """role -> the role in words (`the vLLM server`); any other: `the trainer`."""
    again: dict[str, str] = field(default_factory=dict)
    """role -> what its restart starts again; any other: `the trainer`."""
    alone: dict[str, str] = field(default_factory=dict)
    """role restarted alone while the trainer goes on -> how the trainer goes on (the words after `goes on`)."""
    logs_role: dict[str, str] = field(default_factory=dict)
    """role -> the `logs --role` that shows it, where that is another role."""


@dataclass(frozen=True)
class Engine:
    name: str
    description: str
    roles: tuple[str, ...]
    main_role: str
    """The role whose host profile supplies the training settings (and whose identity owns the run's files)."""
    role_images: dict[str, str]
    """role -> the image key it runs (spec images.<key>, profile images.<key>): see image_of."""
    role_counts: dict[str, tuple[int, int]]
    """role -> (at least, at most) hosts with it."""
    sections: tuple[str, ...]
    """The settings sections the engine reads."""
    checkpoint_layout: str
    """The checkpoint manager's --layout for this engine's checkpoints (grpo_deploy.runtime.storage.checkpoints)."""
    reader_role: str
    """The role that reads, from another host, what the main role writes on the share (the cross-host check)."""
    single_host_roles: tuple[str, ...]
    """`init` with one host (or none): the roles that host runs."""
    multi_host_roles: tuple[tuple[str, ...], tuple[str, ...]]
    """`init --hosts a,b,...`: the roles of the first host, then of every other host."""
    exclusive_roles: tuple[str, ...] = ()
    """Roles no one host runs together (verl: head and worker are each one Ray node of a host)."""
    progress: tuple[tuple[str, str, str], ...] = ()
    """`up`'s progress line per step after reward and length: (label, step event key, format) of its own metrics."""
    saves_last_step: bool = False
    """The engine also saves at the last step, whatever the cadence."""
    settings_roles: dict[str, str] = field(default_factory=dict)
    """section -> the role whose host profile supplies it; a section not named here comes from the main role's."""
    unsupported: dict[str, str] = field(default_factory=dict)
    """What the engine does not support yet -> the one-line reason a user asking for it is given."""
    replica_role: str | None = None
    """The role a host may run several of (hosts[].replicas), behind the kit's replica proxy; None: no such role."""
    unreadable_share: str = ""
    """What the engine's reader would do with a file on the share it cannot read (the shared-volume probe says it)."""
    published_role: str | None = None
    """The role whose port the run publishes on its host (hosts[].publish says on which IP); None: no role's is."""
    unread_keys: dict[str, str] = field(default_factory=dict)
    """Spec keys (dotted) the engine never reads -> why: refused at the door when set, not silently dropped."""
    watch_keys: dict[str, str | None] = field(default_factory=dict)
    """The engine's metric names the run watcher reads (grpo_deploy.runtime.watch.config.MetricKeys' fields: reward,
    length, capped, kl, ratio, staleness, validation); a key not named keeps MetricKeys' default."""
    logger_keys: dict[str, tuple[str, ...]] = field(default_factory=lambda: {
        "project": ("wandb", "tensorboard", "mlflow"), "entity": ("wandb",)})
    """logger.<key> -> the logger kinds that read it on this engine (a key set for any other kind is refused)."""
    steps_setting: str = ""
    """The spec key of the run's optimizer steps (`overrides.trl.max_steps`): a tune trial's length is written there."""
    tune_figures: dict[str, str] = field(default_factory=dict)
    """What a tune trial shows beside its verdict (answer_tok_s, fwd_bwd_tok_s, peak_gib) -> the step metric holding
    it (its median over the trial)."""
    tune_knobs: tuple[TuneKnob, ...] = ()
    """The engine's knobs (`tune` tries them; those with a what-if are plan's what-if table, in this order)."""
    tune_sides: dict[str, str] = field(default_factory=dict)
    """`diagnose`'s verdict (`trainer-bound`) -> the side of SIDES whose knobs relieve it; a verdict not named here
    (balanced, not enough data) names no side."""
    restart_words: RestartWords = field(default_factory=RestartWords)
    """How `up` names a role of this engine's bring-up that died, and what its restart starts again."""

    # ------------------------------------------------------------------ what it is

    @property
    def what_if(self) -> tuple[TuneKnob, ...]:
        """The knobs of plan's what-if table (grpo_deploy.forecast), in the order it prints them."""
        return tuple(k for k in self.tune_knobs if k.what_if is not None)

    def knob(self, name: str) -> TuneKnob:
        """The knob called *name*; KeyError naming the engine's knobs when it has none of that name."""
        for k in self.tune_knobs:
            if k.name == name:
                return k
        raise KeyError(f"engine {self.name} has no knob {name!r} (its knobs: "
                       f"{', '.join(k.name for k in self.tune_knobs) or 'none'})")

    @property
    def image_roles(self) -> tuple[str, ...]:
        """Image keys of the engine, each once, in the order of its roles."""
        return tuple(dict.fromkeys(self.role_images[r] for r in self.roles))

    def image_of(self, role: str) -> str:
        """The image key *role* runs: the one answer for resolve, preflight, the host checks and `checkpoints`."""
        return self.role_images[role]

    def images_on(self, roles) -> list[str]:
        """The image keys a host running *roles* needs, each once."""
        return list(dict.fromkeys(self.image_of(r) for r in roles))

    def profile_role(self, section: str) -> str:
        """The role whose host profile supplies settings *section*."""
        return self.settings_roles.get(section, self.main_role)

    def image_profile_role(self, key: str) -> str:
        """The role whose host profile gives image *key*'s tag: the main role when it runs that image, else the first
        role that does."""
        if self.image_of(self.main_role) == key:
            return self.main_role
        return next(r for r in self.roles if self.image_of(r) == key)

    def why_not(self, feature: str) -> str | None:
        """The engine's reason it does not support *feature* yet, None when it does."""
        return self.unsupported.get(feature)

    def refuse(self, feature: str, error: type[Exception] = Unsupported) -> None:
        """Raise *error* with the engine's one-line reason when it does not support *feature* yet."""
        why = self.why_not(feature)
        if why is not None:
            raise error(why)

    def role_limit_why(self, role: str) -> str | None:
        """Why more hosts with *role* than the engine takes are refused, when the engine says (else None)."""
        return self.why_not(f"several {role} hosts")

    def foreign_keys(self, spec) -> list[tuple[tuple[str, ...], str]]:
        """(spec key, why) for each engine-specific key of *spec* that names another engine's part: an image the
        engine runs no role with, an overrides section or another spec key it never reads. Refused at the door, not
        ignored."""
        out = []
        for key in type(spec.images).model_fields:
            if key != "build" and getattr(spec.images, key) is not None and key not in self.image_roles:
                out.append((("images", key), f"engine {self.name} runs no {key!r} image (its roles run: "
                                             f"{', '.join(self.image_roles)}): remove images.{key}"))
        for section in spec.overrides:
            if section not in self.sections:
                out.append((("overrides", section), f"engine {self.name} never reads the {section} settings (it "
                                                    f"reads: {', '.join(self.sections)}): remove overrides.{section}"))
        for dotted, why in self.unread_keys.items():
            path = tuple(dotted.split("."))
            node = spec
            for part in path:
                node = getattr(node, part)
            if node is not None:
                out.append((path, f"engine {self.name} never reads it ({why}): remove {dotted}"))
        if not self.spans_hosts(spec):
            for i, host in enumerate(spec.hosts):
                for key in ("interface", "infiniband"):
                    if getattr(host, key):
                        out.append((("hosts", i, key), f"only a cluster across hosts uses it and this spec makes none "
                                                       f"(engine {self.name}, {len(spec.hosts)} host(s)): remove "
                                                       f"hosts[{i}].{key}"))
        return out

    def spans_hosts(self, spec) -> bool:
        """Whether *spec* makes one cluster of several hosts (whose nodes need addresses, interfaces and ports)."""
        return False

    # ------------------------------------------------------------------ what it does (defaults; an engine overrides)

    def derive(self, res: Resolved, problem, derived: list) -> None:
        """Cross-field rules over the merged settings (*problem*(spec key, message)) and derived values appended to
        *derived* as (section, key, value, why)."""

    def gpu_split(self, res: Resolved, host) -> dict[str, list[int]]:
        """GPU indices per role on *host*: the spec's hosts[].gpus, else every GPU of the profile for each role."""
        profile = res.profiles[host.name]
        if profile.accelerator != "cuda":
            return {}
        n = int(profile.hardware.get("gpus_per_host", 1))
        given = dict(host.gpus or {})
        for role in host.roles:
            given.setdefault(role, list(range(n)))
        return given

    def published_ports(self, res: Resolved, host) -> list[int]:
        """TCP ports the run publishes on *host* (preflight checks they are free); this default: none."""
        return []

    def trainer_processes(self, res: Resolved) -> int:
        """Processes of the trl-style trainer role (one FSDP2 group); this default: 1."""
        return 1

    def roles_words(self, res: Resolved, host) -> list[str]:
        """Plan's roles column for *host*: its roles."""
        return list(host.roles)

    def gpu_words(self, res: Resolved, host) -> str:
        """Plan's GPU column for *host*: each role's GPU indices (gpu_split), or "none" without an accelerator."""
        if res.profiles[host.name].accelerator == "none":
            return "none"
        return "; ".join(f"{role} {','.join(map(str, ids))}" for role, ids in self.gpu_split(res, host).items())

    def compose_files(self, res: Resolved, host, first: str) -> list[str]:
        """The compose files of *host*'s env file: the engine's own (*first*), then the shared volume's override
        (an NFS mount, or a bind of the host's already-mounted share)."""
        if res.spec.storage.nfs is not None:
            return [first, COMPOSE_NFS]
        return [first, COMPOSE_BIND] if host.shared_dir else [first]

    def config_files(self, res: Resolved, publish_ips: dict[str, str] | None = None) -> dict[str, str]:
        """config/ of the render: mounted read-only at /etc/grpo-deploy in every container of the run."""
        return {}

    def host_files(self, res: Resolved, host, config_dir: str,
                   publish_ips: dict[str, str] | None = None) -> dict[str, str]:
        """hosts/<host>.* of the render: the compose environment (services, images, users, volume) of *host*."""
        return {}

    def cluster_nodes(self, res: Resolved) -> list:
        """The spec hosts that form one cluster across hosts (their order: the head first), [] when *spans_hosts* is
        false (preflight checks their addresses, ports and reach of each other)."""
        return []

    def cluster_ports(self, res: Resolved) -> ClusterPorts | None:
        """The fixed ports of its cluster across hosts (None when *spans_hosts* is false)."""
        return None

    def k8s_params(self, res: Resolved) -> dict[str, Any]:
        """The engine's own values in k8s/params.env (besides the run's, which every engine has)."""
        return {}

    def k8s_secrets(self, res: Resolved) -> dict[str, str]:
        """The Secrets the engine's pods cannot start without, {name: key}: created by the user in the run's
        namespace, never rendered (none by default; the optional grpo-deploy-secrets is not one)."""
        return {}

    def k8s_config_files(self, res: Resolved) -> dict[str, str]:
        """The engine's run config as its Kubernetes pods read it where it differs from the config/ one, as
        {k8s/<name>: text}: an overlay's generated/<name> takes it in place of config/<name> (none by default)."""
        return {}

    def memory(self, res: Resolved, arch: Architecture, host, role: str, cap: float) -> dict[str, Any] | None:
        """Plan's memory estimate of *role* on *host* (*cap*: bytes per GPU, or of the host), None when none."""
        return None

    def checkpoint_bytes(self, res: Resolved, arch: Architecture,
                         step: int | None = None) -> tuple[int, int, list[str]]:
        """(checkpoint size, adapter version size, explanation lines) of the checkpoint written at *step* (default:
        the run's last). This default: the LoRA weights in fp32 and Adam's two fp32 moments."""
        lora = arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules)
        why = f"{self.name} checkpoint = LoRA {lora * 4 / GB:.3f} GB + Adam state {lora * 8 / GB:.3f} GB"
        return lora * 12, 0, [why]

    def checkpoint_growth(self, res: Resolved) -> tuple[int, int]:
        """(bytes, steps): a checkpoint grows by *bytes* every *steps* steps (plan's closed-form schedule:
        checkpoint_bytes(step) == checkpoint_bytes(0) + bytes * (step // steps)). This default: it does not grow."""
        return 0, 1

    def disk_watchdog(self, res: Resolved) -> dict[str, int] | None:
        """The disk watchdog's settings before each save: this engine's checkpoint estimate (plan's) and the margin;
        None when it is off or the run never saves."""
        ck = res.settings.checkpoints
        if not ck.disk_watchdog or not ck.save_every:
            return None
        estimate = self.checkpoint_bytes(res, Architecture.from_dict(res.architecture))[0] if res.architecture else 0
        return {"checkpoint_bytes": int(estimate), "margin_bytes": int(ck.disk_margin_gb * 1e9)}

    def gpus_held(self, res: Resolved, host) -> list[int]:
        """The GPU indices the run holds on *host* (each once, whichever roles share it); [] without an accelerator."""
        return sorted({i for ids in self.gpu_split(res, host).values() for i in ids})

    def gpus_in_use(self, res: Resolved) -> int:
        """The GPUs the run holds on all its hosts: what its GPU-hours are counted on."""
        return sum(len(self.gpus_held(res, host)) for host in res.spec.hosts)

    def max_completion_length(self, res: Resolved) -> int | None:
        """The answer length cap in tokens, None when the engine's settings do not say it."""
        return None

    def watch(self, res: Resolved) -> dict[str, Any] | None:
        """The run watcher's config (grpo_deploy.runtime.watch.config.WatchConfig): the spec's `watch:` settings, this
        engine's metric names, the planned steps, the GPUs the run holds, the answer cap and the loss objective; None
        when the spec turns the watcher off."""
        settings = res.spec.watch
        if not settings.enabled:
            return None
        dumped = settings.model_dump(mode="json")
        if dumped["cap_share"] == "auto":  # off for length rewards alone: their runs start at the cap by design
            dumped["cap_share"] = None if set(res.settings.data.rewards) <= LENGTH_REWARDS else CAP_SHARE_AUTO
        return {"settings": dumped, "keys": dict(self.watch_keys),
                # none when the run's length is not a step count (TRL: max_steps -1 or 0 = epochs)
                "total_steps": self.total_steps(res) or None, "gpus": self.gpus_in_use(res),
                "max_completion_length": self.max_completion_length(res),
                # its name: loss_objective's words before their explanation in parentheses
                "objective": self.loss_objective(res).split(" (")[0]}

    def adapters_kept(self, res: Resolved) -> int:
        """Adapter versions beside the checkpoints while the run goes (a separate server reads them): plan counts
        their space."""
        return 0

    def diagnose(self, events, res: Resolved):
        """(the run's bottleneck diagnosis from its *events*, the labels of its evidence): `grpo-deploy diagnose`."""
        raise Unsupported(f"diagnose is not built for engine {self.name}")

    def epochs(self, res: Resolved) -> int | None:
        """The epochs the run's steps are counted from (plan's what-if changes them: an exact factor on the steps);
        None when its length is a step count. This default: a step count."""
        return None

    def node_gpus(self, res: Resolved) -> tuple[int, str, str] | None:
        """(GPUs every node of its cluster across hosts needs, the setting that says so, the override that lowers
        it): preflight counts them on each node. None: no count asked. This default: none."""
        return None

    def samples_in_step(self, res: Resolved, step: dict[str, Any]) -> float | None:
        """Samples trained in one logged step (*step*: a `step` event): the metric the watcher reads as `samples`;
        None when the step does not say."""
        value = step.get(self.watch_keys.get("samples") or "batch/samples_per_step")
        return float(value) if isinstance(value, int | float) and value >= 0 else None

    def total_steps(self, res: Resolved) -> int:
        """The optimizer steps of the run."""
        raise NotImplementedError(f"engine {self.name} does not say its total steps")

    def loss_objective(self, res: Resolved) -> str:
        """How the run's loss weights its tokens and answers, in words (`plan` names it before the run; the watcher
        compares it with what the run reports). This default: the engine does not say."""
        return f"unknown: engine {self.name} does not say how its loss is normalised"
