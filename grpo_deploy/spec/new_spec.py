"""New deployment specs: `grpo-deploy init` text, generated from the spec schema (each key with its description) and
filled from a profile; and the embedded default (the local cpu rehearsal)."""

from __future__ import annotations

from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from grpo_deploy.common.values import HostAddress, parse_address
from grpo_deploy.engines import DEFAULT_ENGINE, ENGINES
from grpo_deploy.settings import SECTIONS
from grpo_deploy.spec import profiles
from grpo_deploy.spec.load import loads
from grpo_deploy.spec.schema import DeploymentSpec, LoadedSpec

DEFAULT_PROFILE = "cpu"
COMMENT_COLUMN = 36
LINE_WIDTH = 120
_ADDRESS = TypeAdapter(HostAddress)
# Spec keys whose null means "the profile's value, else the settings' default": init shows that value beside them
# (spec path -> settings key).
PROFILE_BACKED = {
    ("model", "path"): ("model", "path"),
    ("dataset", "name"): ("data", "dataset"),
    ("checkpoints", "keep"): ("checkpoints", "keep"),
    ("checkpoints", "save_every"): ("checkpoints", "save_every"),
    ("checkpoints", "resume"): ("checkpoints", "resume"),
    ("checkpoints", "disk_margin_gb"): ("checkpoints", "disk_margin_gb"),
    ("checkpoints", "disk_watchdog"): ("checkpoints", "disk_watchdog"),
}
OVERRIDE_EXAMPLES = ("#  trl: {learning_rate: 2.0e-5}", "#  vllm: {gpu_memory_utilization: 0.7}")


class InitError(ValueError):
    pass


def host_name(address: str) -> str:
    """A spec host name from an SSH target: its host part, lower case, other characters as '-'."""
    host = parse_address(address).host.lower()
    name = "".join(c if c.isalnum() else "-" for c in host).strip("-")[:40].strip("-")
    return name or "host"


def _hosts(engine: str, addresses: list[str]) -> list[dict[str, Any]]:
    info = ENGINES[engine]
    if not addresses:
        return [{"name": "local", "address": "local", "roles": list(info.single_host_roles)}]
    for address in addresses:
        try:
            _ADDRESS.validate_python(address)
        except ValidationError as exc:
            raise InitError(f"--hosts: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    first, rest = info.multi_host_roles
    most = 1 + min(info.role_counts[role][1] for role in rest)  # the first host's roles, then one per other host
    if len(addresses) > most:
        raise InitError(f"{engine} takes at most {most} hosts (its roles' limits); give a host several server "
                        "replicas with hosts[].replicas instead")
    if len(addresses) == 1:
        return [{"name": host_name(addresses[0]), "address": addresses[0], "roles": list(info.single_host_roles)}]
    names = unique_names([host_name(a) for a in addresses])
    return [{"name": n, "address": a, "roles": list(first if i == 0 else rest)}
            for i, (n, a) in enumerate(zip(names, addresses, strict=True))]


def unique_names(names: list[str]) -> list[str]:
    """Host names made distinct: different addresses may map to one name (spark_1 and spark-1, user@h and h:2222,
    a.lan and a-lan); a later one gets -2, -3 ... (kept within a spec name's 42 characters)."""
    out: list[str] = []
    for name in names:
        candidate, n = name, 1
        while candidate in out:
            n += 1
            suffix = f"-{n}"
            candidate = name[:42 - len(suffix)].rstrip("-") + suffix
        out.append(candidate)
    return out


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _comment(model: type[BaseModel], name: str, extra: str = "") -> str:
    info = model.model_fields[name]
    sub = _model_of(info.annotation)
    text = info.description or (sub.__doc__ if sub is not None else "") or ""
    return (text.strip().split("\n")[0] + extra).strip()


def _line(indent: str, key: str, value: str, comment: str) -> str:
    """`key: value  # comment`, the comment on its own line above when the line would pass the width."""
    head = f"{indent}{key}: {value}" if value else f"{indent}{key}:"
    if not comment:
        return head
    line = f"{head.ljust(COMMENT_COLUMN - 1)} # {comment}"
    return line if len(line) <= LINE_WIDTH else f"{indent}# {comment}\n{head}"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds directly (X or X | None), else None (lists and dicts of models included)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if type(annotation).__name__ in ("UnionType", "_UnionGenericAlias") or get_origin(annotation) is Union:
        models = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if models else None
    return None


def _items_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a list[X] field's items, else None."""
    if get_origin(annotation) is list:
        return _model_of(get_args(annotation)[0])
    return None


def _backing(profile: profiles.Profile, path: tuple[str, ...]) -> str:
    """` (profile P: value)` or ` (default: value)` for a spec key whose null stands for that value, else ''."""
    if path not in PROFILE_BACKED:
        return ""
    section, key = PROFILE_BACKED[path]
    setting = profile.settings.get(section, {}).get(key)
    if setting is not None:
        return f" (profile {profile.name}: {_scalar(setting.value)})"
    field = SECTIONS[section].model_fields[key]
    return "" if field.is_required() else f" (default: {_scalar(field.get_default(call_default_factory=True))})"


def _emit(model: type[BaseModel], data: dict[str, Any], indent: str, path: tuple[str, ...],
          profile: profiles.Profile) -> list[str]:
    """YAML lines for *model*: every field, the value from *data* or the field's default, its description as the
    comment."""
    lines: list[str] = []
    for name, info in model.model_fields.items():
        value = data[name] if name in data else info.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            value = value.model_dump()
        extra = _backing(profile, path + (name,))
        comment = _comment(model, name, extra)
        sub, items = _model_of(info.annotation), _items_model(info.annotation)
        if sub is not None and isinstance(value, dict):
            lines.append(_line(indent, name, "", comment))
            lines += _emit(sub, value, indent + "  ", path + (name,), profile)
        elif items is not None and value:
            lines.append(_line(indent, name, "", comment))
            for item in value:
                item_lines = "\n".join(_emit(items, item, indent + "    ", path + (name,), profile)).split("\n")
                first = next(i for i, line in enumerate(item_lines) if not line.lstrip().startswith("#"))
                lines += item_lines[:first] + [indent + "  - " + item_lines[first].lstrip()] + item_lines[first + 1:]
        else:
            lines.append(_line(indent, name, _scalar(value), comment))
    return lines


def default_run_name(profile_name: str, engine: str) -> str:
    """The run name `init` writes: each engine its own, so that rehearsing one engine and then the other on the same
    share never puts both runs in one run folder (the trl-async rehearsal keeps `rehearsal`, the name the README,
    the committed renders and the Makefile use)."""
    if profile_name != "cpu":
        return f"{profile_name}-{engine}"
    return "rehearsal" if engine == DEFAULT_ENGINE else f"{engine}-rehearsal"


def spec_text(profile_name: str = DEFAULT_PROFILE, engine: str = DEFAULT_ENGINE, hosts: list[str] | None = None,
              run_name: str | None = None) -> str:
    """A commented spec for the profile and engine, every key with its description; validated before it is
    returned."""
    if engine not in ENGINES:
        raise InitError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    try:
        profile = profiles.load(profile_name)
    except profiles.ProfileError as exc:
        raise InitError(str(exc)) from None
    mismatch = profiles.engine_mismatch(profile, engine)
    if mismatch:
        raise InitError(mismatch)
    host_list = [dict(h, profile=profile.name) for h in _hosts(engine, hosts or [])]
    data: dict[str, Any] = {
        "engine": engine,
        "run": {"name": run_name or default_run_name(profile_name, engine)},
        "hosts": host_list,
    }
    if len({h["address"] for h in host_list}) > 1:
        data["storage"] = {"nfs": {"server": parse_address(host_list[0]["address"]).host,
                                   "export": "/srv/grpo-deploy"}}
    header = [
        f"# grpo-deploy deployment spec (written by `grpo-deploy init --profile {profile.name} --engine {engine}`).",
        "# Every key is shown with what it means; unknown keys are an error. Tuned values come from the hardware",
        f"# profile {profile.name}: {profile.description}.",
        "# `grpo-deploy plan --explain` lists each setting with its source and reason.",
        "# Precedence: profile -> the fields below -> overrides.",
    ]
    body = _emit(DeploymentSpec, data, "", (), profile)
    text = "\n".join(header + body + list(OVERRIDE_EXAMPLES)) + "\n"
    try:
        loads(text, source=f"<init {profile_name}/{engine}>")  # never hand out a spec that does not validate
    except Exception as exc:
        raise InitError(f"the spec for these values does not validate: {exc}") from None
    return text


def embedded_default() -> LoadedSpec:
    """The spec used when none is given: the cpu rehearsal on the local host."""
    return loads(spec_text(), source="<embedded default: cpu rehearsal on the local host>")

