"""The spec's schema: the pydantic models of a deployment spec (unknown keys refused, no coercion), and the types a
reading of one reports in (Problem, SpecError, LoadedSpec)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, PlainValidator
from pydantic_core import PydanticCustomError

from grpo_deploy.architecture import ArchitectureSpec
from grpo_deploy.common.shown import shown, shown_key
from grpo_deploy.common.strict import Strict
from grpo_deploy.common.values import (
    MAX_DISK_GB,
    AbsPath,
    Count,
    Finite,
    HostAddress,
    HostOnly,
    ImageRef,
    InterfaceName,
    IpAddress,
    Label,
    ModelRef,
    Name,
    NfsOptions,
    NonNegative,
    OwnPath,
    Resume,
    ServedName,
    Uid,
    VolumeName,
)
from grpo_deploy.engines import ALL_ROLES, ENGINES
from grpo_deploy.runtime.tasks.data import DATASETS
from grpo_deploy.runtime.watch.config import WatchSettings
from grpo_deploy.settings import OVERRIDE_SECTIONS
from grpo_deploy.spec.yamlpos import Located

Role = Literal[ALL_ROLES]
MAX_REPLICAS_PER_HOST = 16  # server replicas on one host: one per GPU of the largest node, twice over


def _umask(value: str) -> str:
    if not re.fullmatch(r"0?[0-7]{3}", value):
        raise ValueError(f"{shown(value)} is not a umask: write an octal string such as '0022' (quoted: YAML reads an "
                         "unquoted 0022 as the number 18)")
    return value.zfill(4)


Umask = Annotated[str, AfterValidator(_umask)]


def _engine_name(value: Any) -> str:
    """An engine the registry knows (grpo_deploy.engines.ENGINES, read when the spec is: an engine registered later
    is known too), refused as pydantic refuses a literal."""
    if isinstance(value, str) and value in ENGINES:
        return value
    names = [repr(n) for n in ENGINES]
    expected = " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"
    raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})


EngineName = Annotated[str, PlainValidator(_engine_name, json_schema_input_type=str)]


class _Strict(Strict):
    """Unknown keys refused; no coercion (YAML's `on` is not a UID, "no" is not false)."""

    # The spec schema differs from Strict in one respect, kept as it was: its models are not frozen, and an
    # assignment is validated like a loaded value. No code in the kit assigns to a loaded spec today; freezing it
    # would be a change of behaviour of its own (frozen models hash and refuse assignment), not part of sharing a base.
    model_config = ConfigDict(frozen=False, validate_assignment=True)


class RoleIdentity(_Strict):
    """Who a role's processes run as. Leave unset: both roles then run as run.uid/run.gid."""

    uid: Uid | None = None
    """UID of this role (non-root)."""
    gid: Uid | None = None
    """GID of this role (non-root)."""
    umask: Umask | None = None
    """umask of this role, e.g. '0022'."""


class RunSpec(_Strict):
    """The run: its name, and who every process runs as."""

    name: Name = "rehearsal"
    """Lowercase letters, digits, '-'; names the run dir <storage.mount>/runs/<name>."""
    uid: Uid = 1000
    """UID of every process of the run, on every host (non-root): the trainer writes adapters 0600."""
    gid: Uid = 1000
    """GID of every process of the run, on every host (non-root)."""
    umask: Umask = "0022"
    """umask of every process (quoted)."""
    seed: NonNegative = Field(0, le=2**32 - 1)
    """Seed of the trainer and the server's sampling."""
    roles: dict[Role, RoleIdentity] = {}
    """Per-role {uid, gid, umask} overrides: leave empty (preflight refuses a split that breaks the hand-over)."""


class HostSpec(_Strict):
    """A host and what it runs."""

    name: Name
    """Short name of the host in this spec (lowercase letters, digits, '-')."""
    address: HostAddress = "local"
    """'local' for this machine, else an SSH target: an alias, host, user@host[:port] or an IP address."""
    profile: str
    """Hardware profile (`grpo-deploy profiles`)."""
    roles: list[Role] = Field(min_length=1)
    """What this host runs."""
    gpus: dict[Role, list[NonNegative]] | None = None
    """GPU indices per role; null = the profile's split."""
    mount: OwnPath | None = None
    """Container mount point of the shared volume on this host (must equal storage.mount)."""
    shared_dir: OwnPath | None = None
    """Host directory where the share is already mounted (bind-mounted at storage.mount). With storage.nfs as well,
    the containers still mount the export themselves; shared_dir then says where the host mounts the same export
    (Ansible's nfs_client role mounts it there, `grpo-deploy check`'s nfs_mount verifies it, preflight probes what
    compose mounts)."""
    interface: InterfaceName | None = None
    """A cluster across hosts (verl's Ray nodes; trl-async's trainer hosts): this node's interface for Ray, NCCL and
    Gloo (e.g. ib0); null = the one SSH reaches. Its IPv4 address is the node's address; preflight checks it exists
    and reaches the first node (and every other, for Ray)."""
    infiniband: bool = False
    """A cluster across hosts: pass /dev/infiniband into the container (NCCL over RDMA, not TCP).
    Preflight refuses a host that has /dev/infiniband without it, or this set on a host without one."""
    replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS_PER_HOST)
    """vLLM server replicas on this host (trl-async); null = 1.
    Each is its own container and, on a GPU host, has its own share of the server's GPUs. With more than one replica
    in the run, the trainer talks to the kit's replica proxy beside it, which broadcasts adapter loads to every
    replica and routes completions by prompt prefix."""
    publish: IpAddress | None = None
    """IP on this host the vLLM port is published on; null = the address the trainer reaches it by (never all
    interfaces unless 0.0.0.0 is written here: vLLM's LoRA and dev endpoints have no authentication)."""


class ModelSpec(_Strict):
    """The base model."""

    path: ModelRef | None = None
    """null = the profile's; a hub id or an absolute path inside the containers."""
    served_name: ServedName | None = None
    """null = model.path."""
    architecture: ArchitectureSpec | None = None
    """Only for models plan does not know: {hidden_size, intermediate_size, num_hidden_layers, ...}."""


class DatasetSpec(_Strict):
    """Training prompts."""

    name: Literal[DATASETS] | None = None
    """null = the profile's; brevity | boxed-math | gsm8k."""
    path: AbsPath | None = None
    """A file on the shared volume, e.g. /shared/data/train.jsonl."""
    size: Count | None = None
    """Number of training prompts, for plan (known datasets have a default)."""


class NfsSpec(_Strict):
    """The NFS share every host mounts."""

    server: HostOnly
    """NFS server host name or IP address."""
    export: AbsPath
    """Exported path on the server."""
    options: NfsOptions = "nfsvers=4.1,hard,lookupcache=positive"
    """Mount options."""


class StorageSpec(_Strict):
    """The shared volume."""

    mount: OwnPath = "/shared"
    """ONE absolute path, the same in every container on every host."""
    volume: VolumeName = "grpo-deploy-shared"
    """Docker volume name on each host."""
    nfs: NfsSpec | None = None
    """The share every host mounts; null = a local volume or hosts[].shared_dir."""


class ImagesSpec(_Strict):
    """Container images."""

    build: bool = True
    """Build missing images locally (the air-gapped path) instead of failing."""
    server: ImageRef | None = None
    """null = the profile's tag."""
    trainer: ImageRef | None = None
    """null = the profile's tag."""
    verl: ImageRef | None = None
    """null = the profile's tag."""


class LoggerSpec(_Strict):
    """Where metrics go besides the run's metrics.jsonl."""

    kind: Literal["none", "jsonl", "wandb", "tensorboard", "mlflow"] = "none"
    """none | jsonl | wandb | tensorboard | mlflow (wandb: preflight checks the key first)."""
    project: Label | None = None
    """Logger project."""
    entity: Label | None = None
    """Logger entity (team)."""


class CheckpointsSpec(_Strict):
    """Checkpoints: where, how many, how often, resume."""

    dir: OwnPath | None = None
    """null = <storage.mount>/runs/<run.name>/checkpoints (absolute, on the shared volume)."""
    keep: Count | Literal["all"] | None = None
    """null = the profile's; an integer, or 'all'."""
    save_every: Count | None = None
    """null = the profile's cadence, in steps."""
    resume: Resume | None = None
    """null = the profile's or the kit's default; auto (newest complete) | never | an absolute checkpoint path."""
    disk_margin_gb: Finite | None = Field(None, ge=0, le=MAX_DISK_GB)
    """null = the profile's or the kit's default; GB of free space left after the peak of checkpoints + adapters."""
    disk_watchdog: bool | None = None
    """null = the profile's or the kit's default; stop cleanly before a save that cannot fit (newest complete kept)."""


MAX_GPU_HOUR_PRICE = 10_000.0  # per GPU-hour, in any currency: a larger price is a typo (an H200 rents for a few)
_CURRENCY = re.compile(r"[A-Za-z][A-Za-z0-9]{0,9}")


def _currency(value: str) -> str:
    if not _CURRENCY.fullmatch(value):
        raise ValueError("must be a short label: 1-10 letters or digits, starting with a letter (e.g. USD, EUR)")
    return value


class CostSpec(_Strict):
    """The price of a GPU-hour: `plan` turns its forecast GPU-hours into a cost."""

    gpu_hour: Finite = Field(gt=0, le=MAX_GPU_HOUR_PRICE)
    """Price of one GPU for one hour (positive, at most 10,000)."""
    currency: Annotated[str, AfterValidator(_currency)] = "USD"
    """Short label shown beside the cost (USD, EUR, ...)."""


class DeploymentSpec(_Strict):
    """A deployment: hosts and roles, engine, model, data, storage, identity, images, logger, checkpoints, cost."""

    version: Literal[1] = 1
    """Spec format version."""
    engine: EngineName
    """trl-async (TRL async GRPO + vLLM server) | verl."""
    run: RunSpec = RunSpec()
    hosts: list[HostSpec] = Field(min_length=1)
    model: ModelSpec = ModelSpec()
    dataset: DatasetSpec = DatasetSpec()
    storage: StorageSpec = StorageSpec()
    images: ImagesSpec = ImagesSpec()
    logger: LoggerSpec = LoggerSpec()
    checkpoints: CheckpointsSpec = CheckpointsSpec()
    watch: WatchSettings = WatchSettings()
    """The run watcher beside the trainer: a flat reward (warn, or save and stop), answers at the length cap, KL
    and importance ratio out of band, a changed loss objective."""
    cost: CostSpec | None = None
    """null = no price (plan forecasts GPU-hours without a cost); e.g. {gpu_hour: 3.5, currency: USD}."""
    overrides: dict[Literal[OVERRIDE_SECTIONS], dict[str, Any]] = {}
    """Hyperparameters over the profile, by section: model, lora, data, trl, vllm, verl, runtime."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: where (file:line), which key, what and how to fix it."""

    where: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.key}: {self.message}"


class SpecError(ValueError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def key_str(path: tuple[Any, ...]) -> str:
    """`a.b[0].c`; a key that is not printable text (a newline, NUL ...) quoted, so a problem stays one line."""
    out = ""
    for part in path:
        text = shown_key(part)
        out += f"[{part}]" if isinstance(part, int) else (f".{text}" if out else text)
    return out or "<top>"


@dataclass(frozen=True)
class LoadedSpec:
    spec: DeploymentSpec
    doc: Located

    def where(self, *path: Any) -> str:
        return self.doc.where(tuple(path))

