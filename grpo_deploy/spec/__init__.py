"""The deployment spec: its schema, loading with file:line errors, and the cross-field rules of a valid spec."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import PydanticCustomError

from grpo_deploy.architecture import ArchitectureSpec
from grpo_deploy.common.shown import did_you_mean, shown, shown_key
from grpo_deploy.common.strict import Strict
from grpo_deploy.common.values import (
    MAX_DISK_GB,
    SECRET_WORDS,
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
    describe_error,
    error_location,
    parse_address,
)
from grpo_deploy.engines import ALL_ROLES, ENGINES
from grpo_deploy.runtime.tasks.data import DATASETS
from grpo_deploy.runtime.watch.config import WatchSettings
from grpo_deploy.settings import OVERRIDE_SECTIONS
from grpo_deploy.spec import profiles
from grpo_deploy.spec.yamlpos import Located, YamlSyntaxError, load_file, load_text, shown_path

Role = Literal[ALL_ROLES]
# Environment variables whose values are credentials: a spec holding one of their values is refused.
SECRET_ENV_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD")
SECRET_ENV_WORDS = SECRET_WORDS  # the kit's one list of credential words (runtime.values)
MAX_REPLICAS_PER_HOST = 16  # server replicas on one host: one per GPU of the largest node, twice over
SECRET_MIN_LEN = 6  # a planted value this short is still caught; shorter ones match too much ordinary text


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


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The spec model that holds the last key of *loc* (for "did you mean" on an unknown key)."""
    cls: Any = DeploymentSpec
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or part not in cls.model_fields:
            return None
        cls = inner_model(cls.model_fields[part].annotation)
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, list, dict) or type(annotation).__name__ == "UnionType":
        for arg in get_args(annotation):
            found = inner_model(arg)
            if found is not None:
                return found
    return None


def _pydantic_problems(exc: ValidationError, doc: Located) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc, msg = error_location(err)
        if err["type"] == "extra_forbidden":
            model = _model_at(loc)
            known = sorted(model.model_fields) if model else []
            msg = "unknown key" + (did_you_mean(str(loc[-1]), known) or (f"; allowed: {', '.join(known)}"
                                                                         if known else ""))
        else:
            msg = describe_error(err) if msg is None else msg
        problems.append(Problem(doc.where(loc), key_str(loc), msg))
    return problems


@dataclass(frozen=True)
class LoadedSpec:
    spec: DeploymentSpec
    doc: Located

    def where(self, *path: Any) -> str:
        return self.doc.where(tuple(path))


def secret_values(environ: dict[str, str] | None = None) -> dict[str, str]:
    """{value: variable name} of the caller's credentials (known names, and names that say TOKEN, SECRET ...)."""
    environ = os.environ if environ is None else environ
    return {value: name for name, value in environ.items() if len(value) >= SECRET_MIN_LEN
            and (name in SECRET_ENV_NAMES or any(w in name.upper() for w in SECRET_ENV_WORDS))}


def _secret_problems(doc: Located, secrets: dict[str, str]) -> list[Problem]:
    """A spec must not hold a credential: any string in it that contains the value of one is refused."""
    problems = []

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                # A key that holds a secret is shown by its place, never by its text.
                shown = "<a key>" if isinstance(key, str) and any(s in key for s in secrets) else key
                walk(key, path + ("<a key>",))
                walk(value, path + (shown,))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, path + (i,))
        elif isinstance(node, str):
            for value, name in secrets.items():
                if value in node:
                    problems.append(Problem(doc.where(path), key_str(path),
                                            f"holds the value of ${name} from your environment: a spec is a plain "
                                            "file and its values reach rendered files; remove it (credentials are "
                                            "passed to the containers from the environment at start)"))
                    return

    if secrets:
        walk(doc.data, ())
    return problems


def parse(doc: Located, environ: dict[str, str] | None = None) -> LoadedSpec:
    """Validate a located YAML document into a spec; raise SpecError listing every problem."""
    if not isinstance(doc.data, dict):
        raise SpecError([Problem(doc.where(()), "<top>", "the spec must be a YAML mapping")])
    if doc.data and not any(key in DeploymentSpec.model_fields for key in doc.data):
        # Not a spec at all (a wrong -f, a link to another file): say so without quoting any of it.
        raise SpecError([Problem(doc.where(()), "<top>", "this is not a deployment spec (none of its "
                                 f"{len(doc.data)} top-level key(s) is one a spec has: "
                                 f"{', '.join(DeploymentSpec.model_fields)}); check -f, or write one with "
                                 "`grpo-deploy init`")])
    secrets = _secret_problems(doc, secret_values(environ))
    if secrets:
        raise SpecError(secrets)
    try:
        spec = DeploymentSpec.model_validate(doc.data)
    except ValidationError as exc:
        raise SpecError(_pydantic_problems(exc, doc)) from None
    loaded = LoadedSpec(spec, doc)
    problems = check_consistency(loaded)
    if problems:
        raise SpecError(problems)
    return loaded


def load(path: str | Path) -> LoadedSpec:
    try:
        doc = load_file(Path(path))
    except YamlSyntaxError as exc:
        raise SpecError([Problem(shown_path(path), "<file>", str(exc))]) from None
    return parse(doc)


def loads(text: str, source: str = "<spec>") -> LoadedSpec:
    try:
        doc = load_text(text, source)
    except YamlSyntaxError as exc:
        raise SpecError([Problem(source, "<yaml>", str(exc))]) from None
    return parse(doc)


THIS_MACHINE = ("<this machine>", 0)
"""The machine of a host with address 'local', and of one whose SSH address is loopback on port 22."""


def _machine(address: str) -> tuple[str, int]:
    """The machine a host address names, as (host, SSH port): the user does not make another machine."""
    if address == "local":
        return THIS_MACHINE
    target = parse_address(address)
    host, port = target.host.lower().rstrip("."), target.port or 22
    literal = host if host != "localhost" else "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(literal).is_loopback
    except ValueError:
        loopback = False
    return THIS_MACHINE if loopback and port == 22 else (host, port)


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def check_consistency(loaded: LoadedSpec) -> list[Problem]:
    """Cross-field rules that do not need the profiles' values (those are checked when resolving)."""
    spec, problems = loaded.spec, []
    engine = ENGINES[spec.engine]

    def add(path: tuple[Any, ...], message: str) -> None:
        problems.append(Problem(loaded.doc.where(path), key_str(path), message))

    def add_publish(i: int, host: HostSpec) -> None:
        """hosts[].publish: only a host whose server the main role reaches over the network publishes anywhere."""
        served, main = engine.published_role, engine.main_role
        if served not in host.roles:
            add(("hosts", i, "publish"), f"host {host.name} runs no {served or 'server'} role, so nothing of it is "
                f"published{'' if served else f' (engine {spec.engine} publishes no port)'}: remove "
                f"hosts[{i}].publish")
        elif main in host.roles:
            add(("hosts", i, "publish"), f"host {host.name} runs the {main} too: its {served} is reached over the "
                "compose network and published on loopback only, so publish would be ignored; remove "
                f"hosts[{i}].publish")
        elif ipaddress.ip_address(host.publish).is_loopback:
            add(("hosts", i, "publish"), f"{host.publish} is loopback and the {main} runs on another host, which "
                f"cannot reach it there: remove hosts[{i}].publish (the {served} then publishes on the address the "
                f"{main} uses), or write this host's IP (0.0.0.0 for all interfaces)")

    names_seen: set[str] = set()
    local_hosts = 0
    for i, host in enumerate(spec.hosts):
        if host.name in names_seen:
            add(("hosts", i, "name"), f"duplicate host name {host.name!r}")
        names_seen.add(host.name)
        local_hosts += host.address == "local"
        try:
            profile = profiles.load(host.profile)
        except profiles.ProfileError as exc:
            add(("hosts", i, "profile"), str(exc))
            continue
        mismatch = profiles.engine_mismatch(profile, spec.engine)
        if mismatch:
            add(("hosts", i, "profile"), mismatch)
        for j, role in enumerate(host.roles):
            if role not in engine.roles:
                add(("hosts", i, "roles", j),
                    f"role {role!r} is not a {spec.engine} role; allowed: {', '.join(engine.roles)}")
            elif role in host.roles[:j]:
                add(("hosts", i, "roles", j), f"role {role!r} is listed twice")
        if host.mount is not None and host.mount != spec.storage.mount:
            add(
                ("hosts", i, "mount"),
                f"the shared volume is mounted at {shown(host.mount)} here but at {shown(spec.storage.mount)} "
                f"(storage.mount) elsewhere: the adapter path the trainer sends must resolve to the same "
                f"absolute path in every container. Remove hosts[{i}].mount or make them equal",
            )
        if host.replicas is not None and engine.replica_role not in host.roles:
            add(("hosts", i, "replicas"), f"replicas count {engine.replica_role or 'server'} replicas and host "
                f"{host.name} runs no {engine.replica_role or 'server'} role"
                f"{'' if engine.replica_role else f' (engine {spec.engine} has none)'}: remove hosts[{i}].replicas")
        for role in host.gpus or {}:
            if role not in host.roles:
                add(("hosts", i, "gpus", role), f"GPUs given for role {role!r} which this host does not run")
        if host.gpus and profile.accelerator != "cuda":
            add(("hosts", i, "gpus"), f"profile {profile.name} has no GPUs (accelerator {profile.accelerator}): the "
                f"kit reserves none and the GPUs listed would be ignored; remove hosts[{i}].gpus or use a GPU profile")
        if host.publish is not None:
            add_publish(i, host)
    if local_hosts > 1:
        add(("hosts",), "more than one host has address 'local'")
    machines: dict[tuple[str, int], int] = {}
    for i, host in enumerate(spec.hosts):
        machine = _machine(host.address)
        first = machines.setdefault(machine, i)
        if first == i or spec.hosts[first].name == host.name:  # (a duplicate name says enough)
            continue
        if machine == THIS_MACHINE:
            if host.address == spec.hosts[first].address == "local":
                continue  # (more than one 'local' is said above)
            at, other = (i, first) if host.address != "local" else (first, i)
            add(("hosts", at, "address"), f"{shown(spec.hosts[at].address)} is this machine, and so is hosts[{other}] "
                f"(address {shown(spec.hosts[other].address)}): two hosts of a spec are two machines (each would "
                "claim the same GPUs, and a container's loopback is not the host's); put both roles on one host "
                "entry instead")
        else:
            add(("hosts", i, "address"), f"the same SSH host and port as hosts[{first}]: two hosts of a spec are two "
                "machines (the server would publish on loopback while the trainer is told the remote name); put "
                "both roles on one host entry instead")

    running = {role for h in spec.hosts for role in h.roles}
    for role in spec.run.roles:
        if role not in running:
            add(("run", "roles", role), f"no host of this spec runs role {role!r} (engine {spec.engine}, roles run: "
                f"{', '.join(r for r in engine.roles if r in running)}): its identity would never be used; remove "
                f"run.roles.{role}")


    for path, message in engine.foreign_keys(spec):
        add(path, message)

    for role, (least, most) in engine.role_counts.items():
        having = [i for i, h in enumerate(spec.hosts) if role in h.roles]
        if len(having) > most and engine.role_limit_why(role):
            add(("hosts", having[most], "roles"), engine.role_limit_why(role))
        elif not least <= len(having) <= most:
            count = f"exactly {least}" if least == most else f"at least {least}" if len(having) < least else \
                f"at most {most}"
            add(("hosts",), f"{spec.engine} needs {count} host(s) with role {role!r}, found {len(having)}")

    ckpt = spec.checkpoints
    if ckpt.dir is not None and not (ckpt.dir == spec.storage.mount or ckpt.dir.startswith(spec.storage.mount + "/")):
        add(
            ("checkpoints", "dir"),
            f"{shown(ckpt.dir)} is not under the shared volume {shown(spec.storage.mount)}: a resume on another host "
            "(or after a container restart) would not find it",
        )
    if ckpt.resume not in (None, "auto", "never") and not _under(ckpt.resume, spec.storage.mount):
        add(
            ("checkpoints", "resume"),
            f"{shown(ckpt.resume)} is not under the shared volume {shown(spec.storage.mount)}: the containers see the "
            "share only there, and every checkpoint the kit writes is on it; give the checkpoint's path under "
            f"{shown(spec.storage.mount)}",
        )
    for key in ("project", "entity"):
        kinds = engine.logger_keys.get(key, ())
        if getattr(spec.logger, key) is not None and spec.logger.kind not in kinds:
            add(("logger", key), f"logger.kind {spec.logger.kind} reads no {key} on engine {spec.engine} (read by: "
                f"{', '.join(kinds) or 'none of its loggers'}), so it would be ignored: remove logger.{key}"
                + (f", or set logger.kind to {' or '.join(kinds)}" if kinds else ""))
    if spec.storage.nfs is None and len({h.address for h in spec.hosts}) > 1:
        missing = [i for i, h in enumerate(spec.hosts) if not h.shared_dir]
        if missing:
            add(
                ("storage", "nfs"),
                "hosts on different machines need a shared volume: set storage.nfs (server, export) "
                "or hosts[].shared_dir (where the share is already mounted on each host)",
            )
    return problems
