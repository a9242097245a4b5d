"""The deployment spec: its schema, loading with file:line errors, and the cross-field rules of a valid spec."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import profiles
from .runtime.data import DATASETS
from .yamlpos import Located, YamlSyntaxError, load_file, load_text

ENGINES = ("trl-async", "verl")
ROLES_BY_ENGINE = {"trl-async": ("server", "trainer"), "verl": ("head", "worker")}
NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _octal_umask(v: str | None) -> str | None:
    """A umask such as '022' or '0022', zero-padded to four digits (None stays None: not set)."""
    if v is None:
        return None
    if not re.fullmatch(r"0?[0-7]{3}", str(v)):
        raise ValueError("umask must be an octal string such as '0022'")
    return str(v).zfill(4)


class RoleIdentity(_Strict):
    """Who a role's processes run as. Leave unset: both roles then run as run.uid/run.gid."""

    uid: int | None = Field(None, ge=0)
    gid: int | None = Field(None, ge=0)
    umask: str | None = None

    @field_validator("umask")
    @classmethod
    def _octal(cls, v: str | None) -> str | None:
        return _octal_umask(v)


class RunSpec(_Strict):
    name: str = Field("rehearsal", pattern=NAME_RE)
    uid: int = Field(1000, ge=1, description="UID of every process of the run, on every host (non-root)")
    gid: int = Field(1000, ge=1)
    umask: str = "0022"
    seed: int = 0
    roles: dict[Literal["server", "trainer", "head", "worker"], RoleIdentity] = Field(default_factory=dict)

    @field_validator("umask")
    @classmethod
    def _octal(cls, v: str) -> str:
        return _octal_umask(v)


class HostSpec(_Strict):
    name: str = Field(pattern=NAME_RE)
    address: str = Field("local", description="'local' for this machine, else an SSH target "
                                              "(alias or user@host[:port])")
    profile: str
    roles: list[Literal["server", "trainer", "head", "worker"]] = Field(min_length=1)
    gpus: dict[Literal["server", "trainer", "head", "worker"], list[int]] | None = None
    mount: str | None = Field(None, description="Container mount point of the shared volume on this host "
                                                "(must equal storage.mount)")
    shared_dir: str | None = Field(None, description="Host directory where the NFS share is mounted "
                                                     "(bind-mounted at storage.mount)")


class ModelSpec(_Strict):
    path: str | None = None
    served_name: str | None = None
    architecture: dict[str, int | bool] | None = None


class DatasetSpec(_Strict):
    name: Literal[DATASETS] | None = None
    path: str | None = None
    size: int | None = Field(None, ge=1, description="Number of training prompts (for plan); known datasets "
                                                     "have a default")


class NfsSpec(_Strict):
    server: str
    export: str
    options: str = "nfsvers=4.1,hard,lookupcache=positive"


class StorageSpec(_Strict):
    mount: str = "/shared"
    volume: str = "grpo-deploy-shared"
    nfs: NfsSpec | None = None

    @field_validator("mount")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be an absolute path (the same on every host and container)")
        return v.rstrip("/") or "/"


class ImagesSpec(_Strict):
    build: bool = Field(True, description="Build missing images locally (air-gapped path) instead of failing")
    server: str | None = None
    trainer: str | None = None
    verl: str | None = None


class LoggerSpec(_Strict):
    kind: Literal["none", "jsonl", "wandb", "tensorboard", "mlflow"] = "none"
    project: str | None = None
    entity: str | None = None


class CheckpointsSpec(_Strict):
    dir: str | None = None
    keep: int | Literal["all"] | None = None
    save_every: int | None = Field(None, ge=1)
    resume: str = "auto"
    disk_margin_gb: float = Field(2.0, ge=0)

    @field_validator("dir")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must be an absolute path on the shared volume (relative dirs resolve per process)")
        return v

    @field_validator("keep")
    @classmethod
    def _keep(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("keep must be >= 1, or 'all'")
        return v


class DeploymentSpec(_Strict):
    version: Literal[1] = 1
    engine: Literal["trl-async", "verl"]
    run: RunSpec = Field(default_factory=RunSpec)
    hosts: list[HostSpec] = Field(min_length=1)
    model: ModelSpec = Field(default_factory=ModelSpec)
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    storage: StorageSpec = Field(default_factory=StorageSpec)
    images: ImagesSpec = Field(default_factory=ImagesSpec)
    logger: LoggerSpec = Field(default_factory=LoggerSpec)
    checkpoints: CheckpointsSpec = Field(default_factory=CheckpointsSpec)
    overrides: dict[Literal["model", "lora", "data", "trl", "vllm", "verl", "runtime"], dict[str, Any]] = Field(
        default_factory=dict
    )


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
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top>"


def _pydantic_problems(exc: ValidationError, doc: Located) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("literal[", "function-"))))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; `grpo-deploy init` writes a commented spec with every key)"
        elif err["type"] == "literal_error":
            msg = f"{msg}, got {err.get('input')!r}"
        problems.append(Problem(doc.where(loc), key_str(loc), msg))
    return problems


@dataclass(frozen=True)
class LoadedSpec:
    spec: DeploymentSpec
    doc: Located

    def where(self, *path: Any) -> str:
        return self.doc.where(tuple(path))


def parse(doc: Located) -> LoadedSpec:
    """Validate a located YAML document into a spec; raise SpecError listing every problem."""
    if not isinstance(doc.data, dict):
        raise SpecError([Problem(doc.where(()), "<top>", "the spec must be a YAML mapping")])
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
    path = Path(path)
    if not path.exists():
        raise SpecError([Problem(str(path), "<file>", "spec file not found (write one with `grpo-deploy init`)")])
    try:
        doc = load_file(path)
    except YamlSyntaxError as exc:
        raise SpecError([Problem(str(path), "<yaml>", str(exc))]) from None
    return parse(doc)


def loads(text: str, source: str = "<spec>") -> LoadedSpec:
    try:
        doc = load_text(text, source)
    except YamlSyntaxError as exc:
        raise SpecError([Problem(source, "<yaml>", str(exc))]) from None
    return parse(doc)


def check_consistency(loaded: LoadedSpec) -> list[Problem]:
    """Cross-field rules that do not need the profiles' values (those are checked when resolving)."""
    spec, problems = loaded.spec, []

    def add(path: tuple[Any, ...], message: str) -> None:
        problems.append(Problem(loaded.doc.where(path), key_str(path), message))

    allowed_roles = ROLES_BY_ENGINE[spec.engine]
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
            if role not in allowed_roles:
                add(("hosts", i, "roles", j),
                    f"role {role!r} is not a {spec.engine} role; allowed: {', '.join(allowed_roles)}")
        if host.mount is not None and host.mount.rstrip("/") != spec.storage.mount:
            add(
                ("hosts", i, "mount"),
                f"the shared volume is mounted at {host.mount!r} here but at {spec.storage.mount!r} "
                f"(storage.mount) elsewhere: the adapter path the trainer sends must resolve to the same "
                f"absolute path in every container. Remove hosts[{i}].mount or make them equal",
            )
        if host.gpus:
            for role in host.gpus:
                if role not in host.roles:
                    add(("hosts", i, "gpus", role), f"GPUs given for role {role!r} which this host does not run")
    if local_hosts > 1:
        add(("hosts",), "more than one host has address 'local'")

    roles = [(i, r) for i, h in enumerate(spec.hosts) for r in h.roles]
    if spec.engine == "trl-async":
        trainers = [i for i, r in roles if r == "trainer"]
        servers = [i for i, r in roles if r == "server"]
        if len(trainers) != 1:
            add(("hosts",), f"trl-async needs exactly one host with role 'trainer', found {len(trainers)}")
        if not servers:
            add(("hosts",), "trl-async needs a host with role 'server'")
        elif len(servers) > 1:
            add(
                ("hosts", servers[1], "roles"),
                "several vLLM server replicas need a proxy that broadcasts adapter loads to every replica "
                "(TRL takes one base URL); that proxy is not built yet: use one server host",
            )
    else:
        heads = [i for i, r in roles if r == "head"]
        if len(heads) != 1:
            add(("hosts",), f"verl needs exactly one host with role 'head', found {len(heads)}")

    ckpt = spec.checkpoints
    if ckpt.dir is not None and not (ckpt.dir == spec.storage.mount or ckpt.dir.startswith(spec.storage.mount + "/")):
        add(
            ("checkpoints", "dir"),
            f"{ckpt.dir!r} is not under the shared volume {spec.storage.mount!r}: a resume on another host "
            "(or after a container restart) would not find it",
        )
    if ckpt.resume not in ("auto", "never") and not ckpt.resume.startswith("/"):
        add(("checkpoints", "resume"), "must be 'auto', 'never' or an absolute checkpoint path")

    if spec.storage.nfs is None and len({h.address for h in spec.hosts}) > 1:
        missing = [i for i, h in enumerate(spec.hosts) if not h.shared_dir]
        if missing:
            add(
                ("storage", "nfs"),
                "hosts on different machines need a shared volume: set storage.nfs (server, export) "
                "or hosts[].shared_dir (where the share is already mounted on each host)",
            )
    return problems
