"""New deployment specs: `grpo-deploy init` text from a profile, and the embedded default (local cpu rehearsal)."""

from __future__ import annotations

from dataclasses import dataclass

from . import profiles
from .render import _template
from .spec import ENGINES, ROLES_BY_ENGINE, LoadedSpec, loads

DEFAULT_PROFILE = "cpu"
DEFAULT_ENGINE = "trl-async"
DEFAULT_MOUNT = "/shared"


class InitError(ValueError):
    pass


@dataclass
class _Host:
    name: str
    address: str
    roles: list[str]


def _hosts(engine: str, hosts: list[str]) -> list[_Host]:
    if not hosts:
        return [_Host("local", "local", list(ROLES_BY_ENGINE[engine]) if engine == "trl-async" else ["head"])]
    if engine == "trl-async":
        if len(hosts) == 1:
            return [_Host(_name(hosts[0]), hosts[0], ["server", "trainer"])]
        if len(hosts) == 2:
            # Seed 004's pair: the first host trains, the second serves.
            return [_Host(_name(hosts[0]), hosts[0], ["trainer"]), _Host(_name(hosts[1]), hosts[1], ["server"])]
        raise InitError("trl-async takes one host (both roles) or two (trainer, server); "
                        "more server replicas need the broadcast proxy, which is not built yet")
    return [_Host(_name(h), h, ["head" if i == 0 else "worker"]) for i, h in enumerate(hosts)]


def _host_only(address: str) -> str:
    return address.split("@", 1)[-1].split(":", 1)[0]


def _name(address: str) -> str:
    host = _host_only(address).lower()
    return "".join(c if c.isalnum() else "-" for c in host).strip("-")[:40] or "host"


def spec_text(profile_name: str = DEFAULT_PROFILE, engine: str = DEFAULT_ENGINE, hosts: list[str] | None = None,
              run_name: str | None = None) -> str:
    """A commented spec for the profile and engine; validated before it is returned."""
    if engine not in ENGINES:
        raise InitError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    try:
        profile = profiles.load(profile_name)
    except profiles.ProfileError as exc:
        raise InitError(str(exc)) from None
    mismatch = profiles.engine_mismatch(profile, engine)
    if mismatch:
        raise InitError(mismatch)
    role_help = ("roles: server (vLLM) and/or trainer" if engine == "trl-async"
                 else "roles: head (runs the job, Ray head) or worker (Ray worker)")
    host_list = _hosts(engine, hosts or [])
    nfs_server = _host_only(host_list[0].address) if len({h.address for h in host_list}) > 1 else None
    text = _template(
        "spec.yaml.j2", profile=profile, engine=engine, hosts=host_list, nfs_server=nfs_server,
        run_name=run_name or ("rehearsal" if profile_name == "cpu" else f"{profile_name}-{engine}"),
        mount=DEFAULT_MOUNT, role_help=role_help,
        profile_model=profile.value("model", "path"), profile_dataset=profile.value("data", "dataset"),
        profile_keep=profile.value("checkpoints", "keep"),
        profile_save_every=profile.value("checkpoints", "save_every"),
    )
    loads(text, source=f"<init {profile_name}/{engine}>")  # never hand out a spec that does not validate
    return text


def embedded_default() -> LoadedSpec:
    """The spec used when none is given: the cpu rehearsal on the local host."""
    return loads(spec_text(), source="<embedded default: cpu rehearsal on the local host>")
