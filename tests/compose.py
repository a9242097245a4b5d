"""A run's containers on this machine's engine through the Docker SDK, by the kit's run label: for the test suites
only (no package module imports it); the deployer drives compose through the hosts' connectors (hosts.project)."""

from __future__ import annotations

import io
import tarfile

from grpo_deploy.names import RUN_LABEL

PROXY_STATS = ("import urllib.request; from grpo_deploy.runtime import run_token; print(urllib.request"
               ".urlopen(urllib.request.Request('http://127.0.0.1:8000/proxy/stats', headers=run_token.env_headers()),"
               " timeout=10).read().decode())")
"""`python3 -c` in a replica proxy's container: its /proxy/stats, with the run's token from the container's
environment (a proxy that has one asks for it)."""


def containers(client, run: str, role: str | None = None, all_: bool = True):
    labels = [f"{RUN_LABEL}={run}"] + ([f"com.docker.compose.service={role}"] if role else [])
    return client.containers.list(all=all_, filters={"label": labels})


def read_file(container, path: str) -> str | None:
    """A file's text from a (running or stopped) container, or None when it does not exist."""
    import docker

    try:
        stream, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return None
    buf = io.BytesIO(b"".join(stream))
    with tarfile.open(fileobj=buf) as tar:
        member = tar.next()
        if member is None or not member.isfile():
            return None
        return tar.extractfile(member).read().decode("utf-8", errors="replace")
