"""Which host is which: testinfra host specs built from the spec's hosts, a testinfra host mapped back to the spec
host it is (by address, else by name), and a testinfra host seen through the kit's connector interface so the checks
read the same host facts (grpo_deploy.hosts.facts) as preflight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_deploy.common.values import parse_address
from grpo_deploy.hosts.connect import Host, Result


def hostspec(address: str) -> str:
    """testinfra's host spec for a spec address: `local://` for 'local', else `paramiko://[user@]host[:port]`."""
    if address == "local":
        return "local://"
    target = parse_address(address)
    host = f"[{target.host}]" if ":" in target.host else target.host
    return (f"paramiko://{target.user + '@' if target.user else ''}{host}"
            f"{':' + str(target.port) if target.port else ''}")


def hostspecs(res) -> list[str]:
    """One testinfra host spec per spec host, in the spec's order."""
    return [hostspec(h.address) for h in res.spec.hosts]


def spec_host_of(res, infra_host) -> Any | None:
    """The spec host a testinfra host is: 'local' for the local backend; else the one whose address names the same
    host (and port and user where both give one), else the one whose name is the testinfra host's name."""
    backend = infra_host.backend
    hosts = res.spec.hosts
    if backend.NAME == "local":
        return next((h for h in hosts if h.address == "local"), None)
    target = getattr(backend, "host", None)
    name = target.name if target is not None else backend.get_hostname()
    port = int(target.port) if target is not None and target.port else None
    user = target.user if target is not None else None
    for h in hosts:
        if h.address == "local":
            continue
        addr = parse_address(h.address)
        if addr.host == name and (port is None or addr.port in (None, port)) and \
                (user is None or addr.user in (None, user)):
            return h
    return next((h for h in hosts if h.name == name), None)


@dataclass
class InfraHost(Host):
    """A testinfra host behind the kit's connector interface (argument lists, quoted for the host's shell)."""

    name: str
    address: str
    infra: Any  # testinfra.host.Host

    @property
    def is_local(self) -> bool:
        return self.infra.backend.NAME == "local"

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 120) -> Result:
        if stdin is not None:
            raise NotImplementedError("the host checks never feed a command's stdin")
        r = self.infra.run(" ".join(["%s"] * len(argv)), *argv)
        return Result(r.rc, r.stdout, r.stderr, r.stdout_bytes)
