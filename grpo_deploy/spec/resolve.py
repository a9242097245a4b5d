"""Resolve a spec against its hosts' profiles into typed settings (grpo_deploy.settings), with where each value came
from and why.

Pure: no I/O beyond reading package data. Precedence: the field's default -> profile value -> spec field -> spec
override -> derived. Every layer is validated against the same section types; an error names the spec key (file and
line) or the profile entry that holds the bad value. Cross-field rules that need the merged values (adapter slots vs
staleness, LoRA rank slots, context length, verl batch divisibility) are the engine's (grpo_deploy.engines: its
derive), checked here over the merged values, naming the key to change.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from grpo_deploy.architecture import known_models
from grpo_deploy.common.shown import shown_key
from grpo_deploy.common.values import describe_error, error_location, parse_address
from grpo_deploy.engines import ALL_ROLES, ENGINES, Engine
from grpo_deploy.settings import SECTIONS, Settings, owned_why, unknown_key_hint
from grpo_deploy.spec import profiles
from grpo_deploy.spec.schema import LoadedSpec, Problem, SpecError, key_str


@dataclass(frozen=True)
class Origin:
    """Where a setting's value came from: source ("default", "profile:<name>", "spec", "override", "derived"), why,
    the spec key that set it (None for profile, default and derived values) and, for a profile value, the profile
    whose file holds the line (a parent's when inherited: the source then says "profile:<name> (from <parent>)")."""

    source: str
    why: str
    path: tuple[Any, ...] | None = None
    profile: str | None = None


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    umask: str

    @property
    def user(self) -> str:
        return f"{self.uid}:{self.gid}"


@dataclass
class Resolved:
    loaded: LoadedSpec
    profiles: dict[str, profiles.Profile]  # host name -> profile
    settings: Settings
    origins: dict[str, dict[str, Origin]]  # section -> key (as written, verl dotted) -> origin, in the order set
    identities: dict[str, Identity] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)
    architecture: dict[str, Any] | None = None

    @property
    def spec(self):
        return self.loaded.spec

    @property
    def engine(self) -> str:
        return self.spec.engine

    @property
    def engine_info(self) -> Engine:
        return ENGINES[self.spec.engine]

    @property
    def run_dir(self) -> str:
        return f"{self.spec.storage.mount}/runs/{self.spec.run.name}"

    def hosts_with(self, role: str):
        return [h for h in self.spec.hosts if role in h.roles]

    def host_for(self, role: str):
        hosts = self.hosts_with(role)
        return hosts[0] if hosts else None

    def image_for(self, role: str) -> str:
        """The image tag *role* runs (the engine says which image key; the spec or the profile gives its tag)."""
        return self.images[self.engine_info.image_of(role)]

    @property
    def main_identity(self) -> Identity:
        return self.identities[self.engine_info.main_role]

    def reach(self, name: str, resolved: dict[str, str] | None = None) -> str:
        """How a container on the trainer's host names host *name* in a URL: its IP as the deployer resolved it on
        the trainer's host (*resolved*: containers do not see /etc/hosts or ssh_config aliases), else the address
        in the spec (an IPv6 literal in brackets)."""
        host = next(h for h in self.spec.hosts if h.name == name)
        if resolved and name in resolved:
            found = resolved[name]
        elif host.address == "local":
            found = name
        else:
            found = parse_address(host.address).host
        return f"[{found}]" if ":" in found else found

    @property
    def checkpoint_dir(self) -> str:
        return self.settings.checkpoints.dir

    @property
    def keep(self) -> int | None:
        """Checkpoints kept; None = keep all."""
        return self.settings.checkpoints.keep

    @property
    def adapter_slots(self) -> int:
        """Adapter versions TRL keeps loaded on the server at once: trl.max_staleness + 2."""
        return self.settings.trl.max_staleness + 2


class _Layers:
    """The raw values of every section, layer over layer, with each value's origin; validated at the end."""

    def __init__(self, loaded: LoadedSpec):
        self.loaded = loaded
        self.raw: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        self.origins: dict[str, dict[str, Origin]] = {name: {} for name in SECTIONS}
        self.problems: list[Problem] = []

    def problem(self, path: tuple[Any, ...], message: str) -> None:
        self.problems.append(Problem(self.loaded.doc.where(path), key_str(path), message))

    def put(self, section: str, key: str, value: Any, origin: Origin, *, none_sets: bool = False) -> None:
        """Set a value; None means "not given here" unless *none_sets* (a profile's null, `keep: all`)."""
        if value is None and not none_sets:
            return
        self.origins[section].pop(key, None)  # re-insert: the order of origins is the order values were last set
        self.raw[section][key] = value
        self.origins[section][key] = origin

    def default(self, section: str, key: str) -> None:
        """A key a spec field left null and no profile set: its value is the settings model's default, said so (a
        null default, "not set", is not listed; a required key has none)."""
        info = SECTIONS[section].model_fields[key]
        if key in self.origins[section] or info.is_required() or info.get_default(call_default_factory=True) is None:
            return
        why = (info.description or "").strip().split("\n")[0]
        self.origins[section][key] = Origin("default", f"the kit's default ({SECTIONS[section].__name__}): {why}")

    def profile(self, section: str, profile: profiles.Profile) -> None:
        for key, setting in profile.settings.get(section, {}).items():
            inherited = f" (from {setting.profile})" if setting.profile != profile.name else ""
            source = f"profile:{profile.name}{inherited}"
            self.put(section, key, setting.value, Origin(source, setting.why, profile=setting.profile), none_sets=True)

    def override(self, section: str, key: str, value: Any) -> None:
        path = ("overrides", section, key)
        owned = owned_why(section, key)
        if owned:
            self.problem(path, owned)
            return
        why = f"overrides.{section}.{key} in the spec"
        earlier = self.raw[section].get(key)
        if isinstance(value, dict) and isinstance(earlier, dict):
            # A mapping (e.g. vllm.env) adds to the profile's key by key rather than replacing it: a user who adds a
            # logging variable keeps the profile's tuned ones.
            value, why = {**earlier, **value}, f"{why}, merged over {self.origins[section][key].source}"
        # A null written in overrides is a value (the section's type decides whether it may be null), not "unset".
        self.put(section, key, value, Origin("override", why, path), none_sets=True)

    def validate(self, section: str) -> BaseModel | None:
        try:
            return SECTIONS[section].model_validate(self.raw[section])
        except ValidationError as exc:
            for err in exc.errors():
                self._report(section, err)
            return None

    def _report(self, section: str, err: dict) -> None:
        loc, message = error_location(err)
        if message is not None or not loc:
            # A section rule names its key first ("trainer.x y: not a Hydra key"): the key as given, which may hold
            # spaces or ': ' itself, so matched against the keys set rather than split at the first ': '.
            text = describe_error(err)
            key = next((k for k in sorted(self.origins[section], key=len, reverse=True)
                        if text.startswith((f"{k}: ", f"{shown_key(k)}: "))), None)
            if key is not None:
                loc, message = (key,), text.split(": ", 1)[1] if not text.startswith(f"{key}: ") \
                    else text[len(key) + 2:]
        if message is None:
            message = describe_error(err)
        key = str(loc[0]) if loc else ""
        if err["type"] == "extra_forbidden":
            message = f"unknown {section} setting{unknown_key_hint(section, key)}"
        origin = self.origins[section].get(key)
        if origin is not None and origin.path is not None:
            self.problem(origin.path + tuple(loc[1:]), message)
        elif origin is not None and origin.profile is not None:
            self.problems.append(Problem(f"profile {origin.profile}",
                                         key_str(("settings", section) + tuple(loc)), message))
        else:
            self.problems.append(Problem(self.loaded.doc.where(()), key_str((section,) + tuple(loc)),
                                         f"{message} (no profile or spec value sets it)"))


def _role_profile(loaded: LoadedSpec, role: str, load_profile: Callable[[str], profiles.Profile]) -> profiles.Profile:
    host = next(h for h in loaded.spec.hosts if role in h.roles)
    return load_profile(host.profile)


def resolve(loaded: LoadedSpec, load_profile: Callable[[str], profiles.Profile] = profiles.load) -> Resolved:
    """Merge profiles, spec fields and overrides into typed settings; raise SpecError on any rule broken.
    *load_profile* reads a profile by name (the package's profiles; a test passes one of its own)."""
    spec = loaded.spec
    engine = ENGINES[spec.engine]
    main_profile = _role_profile(loaded, engine.main_role, load_profile)
    role_profiles = {role: _role_profile(loaded, role, load_profile) for role in engine.roles
                     if role == engine.main_role or any(role in h.roles for h in spec.hosts)}
    layers = _Layers(loaded)
    for section in SECTIONS:
        layers.profile(section, role_profiles.get(engine.profile_role(section), main_profile))

    def spec_field(section: str, key: str, value: Any, path: tuple[str, ...]) -> None:
        """A spec field over the profile; null = not given (the profile's value stands, else the settings' default)."""
        if value is None:
            layers.default(section, key)
        layers.put(section, key, value, Origin("spec", f"set in the spec ({'.'.join(path)})", path))

    spec_field("model", "path", spec.model.path, ("model", "path"))
    # A path is not a name to serve under: a served name taken from one is model.served_name's to fix.
    named = spec.model.served_name or (spec.model.path or "").startswith("/")
    spec_field("model", "served_name", spec.model.served_name or spec.model.path,
               ("model", "served_name" if named else "path"))
    spec_field("data", "dataset", spec.dataset.name, ("dataset", "name"))
    spec_field("data", "path", spec.dataset.path, ("dataset", "path"))
    ck = spec.checkpoints
    spec_field("checkpoints", "save_every", ck.save_every, ("checkpoints", "save_every"))
    if ck.keep == "all":
        layers.put("checkpoints", "keep", None, Origin("spec", "keep every checkpoint (checkpoints.keep: all)",
                                                       ("checkpoints", "keep")), none_sets=True)
    else:
        spec_field("checkpoints", "keep", ck.keep, ("checkpoints", "keep"))
    if ck.dir:
        spec_field("checkpoints", "dir", ck.dir, ("checkpoints", "dir"))
    else:
        layers.put("checkpoints", "dir", f"{spec.storage.mount}/runs/{spec.run.name}/checkpoints",
                   Origin("derived", "default: on the shared volume, so a resume finds it from any host"))
    spec_field("checkpoints", "resume", ck.resume, ("checkpoints", "resume"))
    spec_field("checkpoints", "disk_margin_gb", ck.disk_margin_gb, ("checkpoints", "disk_margin_gb"))
    spec_field("checkpoints", "disk_watchdog", ck.disk_watchdog, ("checkpoints", "disk_watchdog"))

    for section, entries in spec.overrides.items():
        for key, value in entries.items():
            layers.override(section, key, value)

    sections = {name: layers.validate(name) for name in SECTIONS}
    if layers.problems:
        raise SpecError(layers.problems)
    res = Resolved(loaded, {h.name: load_profile(h.profile) for h in spec.hosts}, Settings(**sections),
                   layers.origins)

    run = spec.run
    for role in ALL_ROLES:
        ident = run.roles.get(role)
        res.identities[role] = Identity(
            uid=ident.uid if ident and ident.uid is not None else run.uid,
            gid=ident.gid if ident and ident.gid is not None else run.gid,
            umask=(ident.umask if ident and ident.umask else run.umask),
        )
    for key in engine.image_roles:
        profile = role_profiles.get(engine.image_profile_role(key), main_profile)
        res.images[key] = getattr(spec.images, key) or profile.images.get(key, "")
    given = spec.model.architecture
    res.architecture = given.model_dump() if given else known_models().get(res.settings.model.path)

    derived: list[tuple[str, str, Any, str]] = []
    engine.derive(res, layers.problem, derived)
    if layers.problems:
        raise SpecError(layers.problems)
    _apply(res, derived)
    return res


def _apply(res: Resolved, derived: list[tuple[str, str, Any, str]]) -> None:
    """Set derived values (section, key, value, why) on the typed settings, with their origin."""
    updates: dict[str, dict[str, Any]] = {}
    for section, key, value, why in derived:
        updates.setdefault(section, {})[key] = value
        res.origins[section].pop(key, None)
        res.origins[section][key] = Origin("derived", why)
    new = {}
    for section, values in updates.items():
        current = getattr(res.settings, section)
        new[section] = type(current).model_validate({**current.model_dump(by_alias=True, exclude_unset=True),
                                                     **values})
    res.settings = res.settings.model_copy(update=new)


def gpu_split(res: Resolved, host) -> dict[str, list[int]]:
    """GPU indices per role on *host*: the spec's hosts[].gpus, else the engine's split of the profile's GPUs."""
    return res.engine_info.gpu_split(res, host)


def as_dict(res: Resolved) -> dict[str, Any]:
    """Plain-data view for --json and for explaining values: every key that was set, with its source and reason."""
    out: dict[str, Any] = {}
    for section, origins in res.origins.items():
        values = getattr(res.settings, section).model_dump(by_alias=True, mode="json")
        out[section] = {key: {"value": values.get(key), "source": o.source, "why": o.why}
                        for key, o in origins.items()}
    return out


def dumps(res: Resolved) -> str:
    return json.dumps(as_dict(res), indent=2, sort_keys=True, default=str)
