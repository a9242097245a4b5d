"""A run's compose project on one host, through that host's connector: put the compose files and the host's render
in the run's folder there, then `docker compose` up/down/logs/ps, container state and files from containers."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass

from grpo_deploy.common.metrics import METRICS_READ_LIMIT
from grpo_deploy.common.readback import ReadRefused
from grpo_deploy.hosts.connect import Host, HostError, Result
from grpo_deploy.kit_data import kit_dir
from grpo_deploy.names import COMPOSE_FILES, ROLE_LABEL, RUN_LABEL, RUN_TOKEN_FILE, project_name
from grpo_deploy.runtime import run_token

ENV_FILE_LABEL = "com.docker.compose.project.environment_file"  # compose's label: the env file a container came from
SERVICE_LABEL = "com.docker.compose.service"  # compose's label: the service a container runs


def compose_files() -> dict[str, str]:
    """The kit's compose files (the same ones `docker compose up` uses in compose/)."""
    folder = kit_dir("compose")
    return {name: (folder / name).read_text(encoding="utf-8") for name in COMPOSE_FILES}


@dataclass
class RemoteProject:
    """`docker compose -p grpo-<run>` on *host*, with the compose files and render under *root* on that host."""

    host: Host
    root: str  # e.g. /home/deploy/.grpo-deploy/<run>
    run_name: str

    @property
    def env_file(self) -> str:
        return f"{self.root}/render/hosts/{self.host.name}.env"

    @property
    def config_dir(self) -> str:
        return f"{self.root}/render/config"

    @property
    def token_file(self) -> str:
        """The run's token on this host (GRPO_RUN_TOKEN=..., 0600), beside render/: compose reads it (as the login
        user) for the roles that send or check it (hosts/<host>.env names it as GRPO_RUN_TOKEN_FILE)."""
        return f"{self.root}/{RUN_TOKEN_FILE}"

    def put(self, render: dict[str, str], token: str | None = None) -> int:
        """Write the compose files and the render (config/ and this host's files) under root, and the run's *token*
        in its 0600 file; bytes written. Config files are 0644 (containers read them as the run user; they hold no
        secrets), the rest 0600."""
        total = 0
        if token is not None:  # into a 0700 folder first: no moment where another user could open it
            folder = self.token_file.rsplit("/", 1)[0]
            made = self.host.run(["sh", "-c", 'mkdir -p -m 0700 "$1" && chmod 0700 "$1"', "sh", folder])
            if not made.ok:
                raise HostError(self.host.name, f"cannot make {folder} for the run's token: {made.line()}",
                                "check that the login user owns the run's folder there")
            self.host.write_file(self.token_file, f"{run_token.ENV}={token}\n".encode(), 0o600)
        for name, text in compose_files().items():
            total += self._write(f"{self.root}/compose/{name}", text, 0o600)
        mine = {rel: (text, 0o644 if rel.startswith("config/") else 0o600) for rel, text in render.items()
                if rel.startswith(("config/", f"hosts/{self.host.name}."))}
        self.host.put_tree(f"{self.root}/render", mine)
        self.host.run(["chmod", "0755", self.root, f"{self.root}/render", self.config_dir])
        return total + sum(len(text.encode("utf-8")) for text, _ in mine.values())

    def _write(self, path: str, text: str, mode: int) -> int:
        data = text.encode("utf-8")
        self.host.write_file(path, data, mode)
        return len(data)

    def compose_argv(self, *args: str) -> list[str]:
        # Run from the project folder: the env file names the compose files relative to it (as compose/.env does).
        folder = f"{self.root}/compose"
        return ["env", "-C", folder, "docker", "compose", "--project-directory", folder, "--env-file", self.env_file,
                "-p", project_name(self.run_name), *args]

    def compose(self, *args: str, timeout: float = 600) -> Result:
        return self.host.run(self.compose_argv(*args), timeout=timeout)

    def up(self, *services: str) -> None:
        r = self.compose("up", "-d", "--no-build", "--no-deps", *services)
        if not r.ok:
            raise HostError(self.host.name, f"docker compose up {' '.join(services)} failed: {r.line()}",
                            f"see grpo-deploy logs; the compose project is {self.root}/compose")

    def down(self, volumes: bool = False) -> Result:
        # every profile: compose leaves a service of an inactive profile (the replica proxy) running otherwise
        return self.compose("--profile", "*", "down", "--remove-orphans", *(["--volumes"] if volumes else []))

    @staticmethod
    def logs_args(roles: list[str], tail: int, follow: bool = False) -> list[str]:
        return ["logs", "--no-color", "--timestamps", "--tail", str(tail), *(["--follow"] if follow else []), *roles]

    def logs(self, tail: int = 200, roles: list[str] | None = None) -> str:
        r = self.compose(*self.logs_args(self.services_of(roles or []), tail))
        return r.out + r.err

    def services_of(self, roles: list[str]) -> list[str]:
        """The compose services of this run's containers here that run one of *roles* (a role's replicas:
        server, server-2, ...); [] for no roles (compose: every service)."""
        if not roles:
            return []
        return sorted({c["service"] for c in self.containers() if c["role"] in roles and c["service"]}) or roles

    def containers(self, strict: bool = False) -> list[dict]:
        """This run's containers on the host: {id, name, role, state, health, exit_code, env_file, service}. A query
        that fails counts as none, or raises HostError when *strict* (status says the engine did not answer)."""
        r = self.host.run(["docker", "ps", "-a", "-q", "--no-trunc", "--filter", f"label={RUN_LABEL}={self.run_name}"])
        ids = r.out.split()
        if strict and not r.ok:
            raise HostError(self.host.name, f"docker ps: {r.line()}", "check the host's Docker engine")
        if not r.ok or not ids:
            return []
        fmt = "\t".join(["{{json .Id}}", "{{json .Name}}", '{{json (index .Config.Labels "' + ROLE_LABEL + '")}}',
                         "{{json .State.Status}}", "{{json .State.ExitCode}}", "{{json (index .State \"Health\")}}",
                         '{{json (index .Config.Labels "' + ENV_FILE_LABEL + '")}}',
                         '{{json (index .Config.Labels "' + SERVICE_LABEL + '")}}'])
        r = self.host.run(["docker", "inspect", "--format", fmt, *ids])
        if strict and not r.ok and not r.out.strip():  # one container gone since ps is not a failure
            raise HostError(self.host.name, f"docker inspect: {r.line()}", "check the host's Docker engine")
        out = []
        for line in r.out.strip().splitlines():
            cid, name, role, status, code, health, env_file, service = (json.loads(p) for p in line.split("\t"))
            out.append({"id": cid, "name": name.lstrip("/"), "role": role, "state": status, "exit_code": code,
                        "health": (health or {}).get("Status"), "env_file": env_file, "service": service})
        return out

    def container(self, role: str, strict: bool = False) -> dict | None:
        found = [c for c in self.containers(strict) if c["role"] == role]
        return found[0] if found else None

    def service(self, name: str, strict: bool = False) -> dict | None:
        """The container of compose service *name* (a server replica: `server`, `server-2`, ...), or None."""
        return next((c for c in self.containers(strict) if c["service"] == name), None)

    def read(self, container_id: str, path: str, limit: int = METRICS_READ_LIMIT) -> str | None:
        """A file's text from a running or stopped container (docker cp to stdout), or None; a file of more than
        *limit* bytes is refused (ReadRefused too-big, one line), as the bounded reader refuses one on this machine."""
        r = self.host.run(["docker", "cp", f"{container_id}:{path}", "-"], timeout=120)
        if not r.ok:
            return None
        data = r.raw
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                member = tar.next()
                if member is None:
                    return None
                where = f"{path} in container {container_id[:12]} on {self.host.name}"
                if not member.isfile():
                    raise ReadRefused("link" if member.issym() or member.islnk() else "not-regular",
                                      f"{where}: is not a regular file; the kit reads it only as one, never through a "
                                      "link: see what the container wrote there")
                if member.size > limit:
                    raise ReadRefused("too-big", f"{where}: is {member.size} bytes, more than {limit} bytes: this is "
                                                 "not the file the kit writes there (or it was damaged)", member.size)
                return tar.extractfile(member).read(limit).decode("utf-8", errors="replace")
        except tarfile.TarError:
            return None

    def has_render(self) -> bool:
        """Whether this host's env file is in place (an `up` of the run put it there)."""
        return self.host.run(["test", "-f", self.env_file]).ok

    def tail(self, container_id: str, lines: int = 15) -> str:
        r = self.host.run(["docker", "logs", "--tail", str(lines), container_id])
        return (r.out + r.err).strip()
