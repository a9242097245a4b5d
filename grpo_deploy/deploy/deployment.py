"""A run's hosts as the deployer holds them: one connector per host (this machine's or SSH) and the run's compose
project on each, with its folder there — ~/.grpo-deploy/<run> on a remote host, the run's own folder
(.grpo-deploy/<run>/) on this machine — and the preflight session over the same connectors (each host connected
once). The only place a host's connector is chosen for a run (hosts.connect.connect)."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_deploy.deploy.run_state import RunState
from grpo_deploy.hosts.connect import Host, SshOptions, connect
from grpo_deploy.hosts.project import RemoteProject
from grpo_deploy.preflight.session import Context
from grpo_deploy.spec.resolve import Resolved


@dataclass
class Deployment:
    """The run's hosts with their connectors and compose projects."""

    res: Resolved
    ssh: SshOptions
    state: RunState = field(init=False)
    hosts: dict[str, Host] = field(default_factory=dict)
    projects: dict[str, RemoteProject] = field(default_factory=dict)
    returning: dict[tuple[str, str], float] = field(default_factory=dict)
    """(host, service) -> when it was started again: a role restarted alone while the run goes on (a vLLM replica),
    not seen ready yet."""
    _context: Context | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self.state = RunState(self.res)
        for host in self.res.spec.hosts:
            self.hosts[host.name] = connect(host, self.ssh)

    def project(self, name: str) -> RemoteProject:
        """The run's compose project on a host (HostError when a remote login's home cannot be read)."""
        if name not in self.projects:
            host = self.hosts[name]
            self.projects[name] = RemoteProject(host, host.run_folder(self.res.spec.run.name), self.res.spec.run.name)
        return self.projects[name]

    @property
    def context(self) -> Context:
        """The preflight session of the run (its checks, the facts read once, the checkpoints' headroom), made on
        first use over the deployment's own connectors: no host is connected twice."""
        if self._context is None:
            self._context = Context(self.res, ssh=self.ssh, connectors=self.hosts)
        return self._context

    def role_host(self, role: str) -> str:
        return self.res.host_for(role).name

    def role_project(self, role: str) -> RemoteProject:
        return self.project(self.role_host(role))

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()
