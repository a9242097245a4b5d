"""One-off containers on a host, through its connector: the one recipe for a throw-away container (the kit's label,
removed when done, no network unless asked, the run's share mounted the way its stack mounts it) and what a failure
to start one means, in the engine's own words."""

from __future__ import annotations

from grpo_deploy.hosts.connect import Host, Result
from grpo_deploy.names import MANAGED

ENGINE_REFUSED = 125  # `docker run`: the engine could not create or start the container (mount, image, options)
_USAGE_HINTS = ("Run 'docker run --help'", "See 'docker run --help'")


def share_source(res, host) -> tuple[str, dict[str, str] | None]:
    """What the stack's containers on *host* mount at storage.mount, in the order the render picks compose files
    (compose.nfs.yaml, else compose.bind.yaml, else the plain volume): (the volume name with its NFS driver options),
    (hosts[].shared_dir, None) or (the volume name, None). One-off containers mount the same, so that a plain volume
    made by one of them is never taken by compose in place of the share (`up --fresh` once wrote every checkpoint to
    Docker's own disk that way)."""
    nfs = res.spec.storage.nfs
    if nfs is not None:
        return res.spec.storage.volume, {"type": "nfs", "o": f"addr={nfs.server},{nfs.options}",
                                         "device": f":{nfs.export}"}
    if host is not None and host.shared_dir:
        return host.shared_dir, None
    return res.spec.storage.volume, None


def share_args(res, host) -> list[str]:
    """`docker run` arguments that mount the run's shared storage on *host* where the containers will see it."""
    mount = res.spec.storage.mount
    source, nfs = share_source(res, host)
    if nfs is not None:
        return ["--mount", f'type=volume,dst={mount},volume-driver=local,volume-opt=type={nfs["type"]},'
                           f'"volume-opt=o={nfs["o"]}",volume-opt=device={nfs["device"]}']
    return ["-v", f"{source}:{mount}"]


def run(conn: Host, image: str, argv: list[str], *, ident=None, share: tuple | None = None, network: str = "none",
        timeout: float = 300, env_file: str | None = None) -> Result:
    """Run argv in a throw-away container of *image* on *conn*'s host; as *ident* (a run identity: its user and
    umask) when given; with the run's share when *share* is (resolved run, spec host); with the variables of
    *env_file* on that host (the run's token: its path on the command line, never its value)."""
    who = ["--user", ident.user, "-e", f"GRPO_UMASK={ident.umask}"] if ident is not None else []
    mounts = share_args(*share) if share is not None else []
    env = ["--env-file", env_file] if env_file else []
    return conn.run(["docker", "run", "--rm", "--network", network, *who, *env, "--label", MANAGED, *mounts, image,
                     *argv], timeout=timeout)


def engine_error(result: Result) -> str | None:
    """When the container never started: the engine's own error, one line, without docker's usage hint (the line
    a reader would otherwise take for the error). None when the command in the container ran."""
    if result.rc != ENGINE_REFUSED:
        return None
    lines = [line.strip() for line in result.err.splitlines()
             if line.strip() and not line.strip().startswith(_USAGE_HINTS)]
    said = next((line for line in lines if "Error response from daemon" in line), lines[-1] if lines else "")
    return said.removeprefix("docker: ").removeprefix("Error response from daemon: ")[:400] or "exit 125"


def start_failure_fix(res, host_name: str, error: str) -> str:
    """The fix for a container that could not start, from the cause the engine named."""
    nfs = res.spec.storage.nfs
    if nfs is not None and "mount" in error:
        return (f"storage.nfs {nfs.server}:{nfs.export} could not be mounted on {host_name}: check that the server "
                f"exports it to this host, that {host_name} reaches {nfs.server} and has an NFS client (nfs-common / "
                "nfs-utils), or remove storage.nfs to use a local volume or hosts[].shared_dir")
    if "mount" in error:
        return f"the share could not be mounted on {host_name}: check hosts[].shared_dir exists there"
    return f"fix what the engine on {host_name} reported"

