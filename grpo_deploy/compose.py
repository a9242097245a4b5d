"""Thin wrapper over the Docker Compose v2 CLI and the Docker SDK for one host's run (local engine today)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .kit_data import kit_dir
from .names import RUN_LABEL


class ComposeError(RuntimeError):
    pass


@dataclass
class Project:
    """`docker compose` for one run on one host, driven by the rendered host env file."""

    env_file: Path
    name: str

    def run(self, *args: str, capture: bool = False, check: bool = True, timeout: float | None = None):
        project_dir = kit_dir("compose")
        cmd = ["docker", "compose", "--project-directory", str(project_dir), "--env-file", str(self.env_file),
               "-p", self.name, *args]
        proc = subprocess.run(cmd, cwd=project_dir, text=True, timeout=timeout, capture_output=capture)
        if check and proc.returncode != 0:
            detail = (proc.stderr or "").strip().splitlines()[-3:] if capture else []
            raise ComposeError(f"docker compose {' '.join(args)} failed (exit {proc.returncode})"
                               + (": " + " | ".join(detail) if detail else ""))
        return proc

    def up(self, *services: str, no_deps: bool = False) -> None:
        self.run("up", "-d", "--no-build", *(["--no-deps"] if no_deps else []), *services, capture=True)

    def down(self, volumes: bool = False) -> None:
        self.run("down", "--remove-orphans", *(["--volumes"] if volumes else []), capture=True, check=False)


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
