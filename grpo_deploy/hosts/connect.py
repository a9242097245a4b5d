"""Connectors: run an argument list on a host and move bytes to it, the same way for this machine (subprocess) and
for a remote one (paramiko over SSH, honouring ~/.ssh/config and verifying host keys). No string is ever built into
a shell command from spec values: argument lists are quoted for the remote shell with shlex."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_deploy.common.values import parse_address
from grpo_deploy.names import STATE_DIR

CONNECT_TIMEOUT_S = 15
CHUNK = 1 << 20


class HostError(RuntimeError):
    """A host could not be reached or a command on it could not run: one line with host, what failed, the fix."""

    def __init__(self, host: str, what: str, fix: str = ""):
        self.host, self.what, self.fix = host, what, fix
        super().__init__(f"host {host}: {what}" + (f"; {fix}" if fix else ""))


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str
    raw: bytes = b""  # stdout as bytes (for binary output such as docker cp)

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def line(self) -> str:
        """The last line of stderr (or stdout): what a failed command said."""
        text = (self.err or self.out).strip().splitlines()
        return text[-1][:300] if text else f"exit {self.rc}"


@dataclass
class SshOptions:
    """How to reach remote hosts: the ssh config file to read (default ~/.ssh/config, like `ssh -F`), and whether
    an unknown host key may be accepted and saved (never a changed one)."""

    config_path: str | None = None
    accept_new_host_keys: bool = False
    command_cap_s: float | None = None  # the longest any one command may take (status: a few seconds), else each
    # command's own limit


class Host:
    """A host of the run. `name` is the spec's name; `address` the spec's address ('local' or an SSH target)."""

    name: str
    address: str
    command_cap_s: float | None = None

    def _limit(self, timeout: float) -> float:
        """A command's time limit: its own, or the connector's cap when that is shorter."""
        return timeout if self.command_cap_s is None else min(timeout, self.command_cap_s)

    @property
    def is_local(self) -> bool:
        return self.address == "local"

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 120) -> Result:
        raise NotImplementedError

    def stream(self, argv: list[str], chunks: Iterable[bytes], timeout: float = 3600) -> Result:
        """Run argv with *chunks* fed to its stdin (e.g. `docker load` fed by `docker save`)."""
        raise NotImplementedError

    def lines(self, argv: list[str]) -> Iterator[str]:
        """Run argv and yield its output lines (stdout and stderr together) as they come; closing the iterator
        (or the connector) stops the command."""
        raise NotImplementedError

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Create or replace a file (parents created, owned by the login user), written then renamed."""
        raise NotImplementedError

    def put_tree(self, folder: str, files: dict[str, tuple[str, int]]) -> None:
        """Write {relative path: (text, mode)} under *folder*, file by file (write_file)."""
        for rel, (text, mode) in files.items():
            self.write_file(f"{folder}/{rel}", text.encode("utf-8"), mode)

    def connect(self) -> Host:
        """Open the connection (this machine's connector has none to open)."""
        return self

    def run_folder(self, run_name: str) -> str:
        """Where a run's compose files and render live on this host: ~/.grpo-deploy/<run> of the login user (HostError
        when the home directory cannot be read)."""
        r = self.run(["pwd"])
        if not r.ok or not r.out.strip():
            raise HostError(self.name, "cannot read the login user's home directory", "check the SSH login")
        return f"{r.out.strip()}/{STATE_DIR}/{run_name}"

    def close(self) -> None:
        pass


@dataclass
class LocalHost(Host):
    name: str = "local"
    address: str = "local"
    command_cap_s: float | None = None

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 120) -> Result:
        timeout = self._limit(timeout)
        try:
            proc = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout)
        except FileNotFoundError:
            return Result(127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return Result(124, "", f"{argv[0]} did not finish within {timeout:.0f} s")
        return Result(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"),
                      proc.stdout)

    def stream(self, argv: list[str], chunks: Iterable[bytes], timeout: float = 3600) -> Result:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err_chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
        reader.start()
        try:
            for chunk in chunks:
                proc.stdin.write(chunk)
            proc.stdin.close()
            out = proc.stdout.read()
            proc.wait(timeout=timeout)
        except BrokenPipeError:
            proc.wait(timeout=timeout)
            out = b""
        reader.join(timeout=5)
        return Result(proc.returncode, out.decode(errors="replace"), b"".join(err_chunks).decode(errors="replace"))

    def lines(self, argv: list[str]) -> Iterator[str]:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            for raw in proc.stdout:
                yield raw.decode(errors="replace").rstrip("\n")
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=10)

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)

    def run_folder(self, run_name: str) -> str:
        """This machine's run folder is the deployer's own: .grpo-deploy/<run> in the working directory (run_state)."""
        return str((Path(STATE_DIR) / run_name).resolve())

    def put_tree(self, folder: str, files: dict[str, tuple[str, int]]) -> None:
        """On this machine the render folder is written as `render -o` writes one (grpo_deploy.render.folder): only
        into a new folder or the kit's own earlier render, files of that render this one lacks removed, nothing
        written through a link, folders kept (containers of the run still up bind-mount config/); HostError when
        refused, the folder untouched."""
        from grpo_deploy.render.folder import WriteRefused, write_tree

        try:
            written = write_tree({rel: text for rel, (text, _) in files.items()}, Path(folder))
        except WriteRefused as exc:
            raise HostError(self.name, f"cannot write the run's render: {exc}", "remove or move that path") from None
        for path, (_, mode) in zip(written, files.values(), strict=True):
            os.chmod(path, mode)


@dataclass
class SshHost(Host):
    name: str
    address: str
    options: SshOptions = field(default_factory=SshOptions)
    _client: Any = None
    _sftp: Any = None
    _jump: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def command_cap_s(self) -> float | None:
        return self.options.command_cap_s

    # ------------------------------------------------------------------ connection

    def _settings(self) -> dict[str, Any]:
        """hostname, user, port, identity files, known_hosts files, proxyjump: from the address, then ssh_config."""
        import paramiko

        target = parse_address(self.address)
        config = paramiko.SSHConfig()
        path = Path(self.options.config_path or Path.home() / ".ssh" / "config").expanduser()
        if path.is_file():
            config = paramiko.SSHConfig.from_path(str(path))
        elif self.options.config_path:
            raise HostError(self.name, f"ssh config {path} not found", "pass an existing file to --ssh-config")
        found = config.lookup(target.host)
        known = found.get("userknownhostsfile", "~/.ssh/known_hosts").split()
        return {
            "hostname": found.get("hostname", target.host),
            "user": target.user or found.get("user") or _local_user(),
            "port": target.port or int(found.get("port", 22)),
            "identity": [str(Path(p).expanduser()) for p in found.get("identityfile", [])],
            "known_hosts": [str(Path(p).expanduser()) for p in known],
            "proxyjump": found.get("proxyjump"),
        }

    def connect(self) -> SshHost:
        with self._lock:
            if self._client is None:
                self._client = self._open()
        return self

    def _open(self):
        import paramiko

        s = self._settings()
        client = paramiko.SSHClient()
        for known in s["known_hosts"]:
            if os.path.isfile(known):
                client.load_host_keys(known)
        if self.options.accept_new_host_keys:
            client.set_missing_host_key_policy(_SaveNewKey(s["known_hosts"][0]))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        sock = None
        if s["proxyjump"] and s["proxyjump"] != "none":
            jump = SshHost(f"{self.name} (jump {s['proxyjump']})", s["proxyjump"].split(",")[0], self.options)
            self._jump = jump.connect()
            sock = jump._client.get_transport().open_channel("direct-tcpip", (s["hostname"], s["port"]), ("", 0))
        where = f"{s['user']}@{s['hostname']}:{s['port']}"
        try:
            client.connect(s["hostname"], port=s["port"], username=s["user"], key_filename=s["identity"] or None,
                           timeout=CONNECT_TIMEOUT_S, banner_timeout=CONNECT_TIMEOUT_S,
                           auth_timeout=CONNECT_TIMEOUT_S, sock=sock, allow_agent=True, look_for_keys=True)
        except paramiko.BadHostKeyException:
            raise HostError(self.name, f"the host key of {where} does not match known_hosts (it changed, or this is "
                            "not the host you think)", "check the host; if it was reinstalled, remove the old key "
                            f"with ssh-keygen -R {s['hostname']}") from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise HostError(self.name, f"unknown host key for {where} (not in {', '.join(s['known_hosts'])})",
                                f"verify it and add it (ssh-keyscan -p {s['port']} {s['hostname']} >> "
                                f"{s['known_hosts'][0]}), or pass --accept-new-host-keys") from None
            if isinstance(exc, paramiko.AuthenticationException):
                raise HostError(self.name, f"SSH login as {s['user']} refused at {where}",
                                "add your public key to the user's authorized_keys, or set User/IdentityFile in "
                                "~/.ssh/config") from None
            raise HostError(self.name, f"SSH to {where} failed: {exc}", "check that sshd runs there") from None
        except socket.gaierror:
            raise HostError(self.name, f"the name {s['hostname']} does not resolve",
                            "fix hosts[].address or add the host to ~/.ssh/config or /etc/hosts") from None
        except TimeoutError:
            raise HostError(self.name, f"no answer from {where} within {CONNECT_TIMEOUT_S} s",
                            "check the address, that the host is up and that no firewall drops port "
                            f"{s['port']}") from None
        except OSError as exc:
            raise HostError(self.name, f"cannot connect to {where}: {exc.strerror or exc}",
                            "check the address and that sshd listens there") from None
        client.get_transport().set_keepalive(15)
        return client

    def close(self) -> None:
        for closable in (self._sftp, self._client, self._jump):
            if closable is not None:
                closable.close()
        self._client = self._sftp = self._jump = None

    # ------------------------------------------------------------------ commands

    def _exec(self, argv: list[str], timeout: float | None):
        self.connect()
        try:
            return self._client.exec_command(shlex.join(argv), timeout=timeout)
        except Exception as exc:  # paramiko raises SSHException / EOFError when the transport died
            raise HostError(self.name, f"the SSH connection broke ({type(exc).__name__}: {exc})",
                            "check the network and the host, then run again") from None

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 120) -> Result:
        timeout = self._limit(timeout)
        chan_in, chan_out, chan_err = self._exec(argv, timeout)
        try:
            if stdin:
                chan_in.write(stdin)
            chan_in.channel.shutdown_write()
            out = chan_out.read()
            err = chan_err.read()
            rc = chan_out.channel.recv_exit_status()
        except TimeoutError:
            chan_out.channel.close()
            return Result(124, "", f"{argv[0]} did not finish within {timeout:.0f} s on {self.name}")
        return Result(rc, out.decode(errors="replace"), err.decode(errors="replace"), out)

    def stream(self, argv: list[str], chunks: Iterable[bytes], timeout: float = 3600) -> Result:
        chan_in, chan_out, chan_err = self._exec(argv, timeout)
        channel = chan_in.channel
        for chunk in chunks:
            channel.sendall(chunk)
        channel.shutdown_write()
        out = chan_out.read()
        err = chan_err.read()
        return Result(channel.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace"))

    def lines(self, argv: list[str]) -> Iterator[str]:
        _, chan_out, _ = self._exec(argv, timeout=None)
        chan_out.channel.set_combine_stderr(True)
        try:
            for raw in chan_out:
                yield raw.rstrip("\n") if isinstance(raw, str) else raw.decode(errors="replace").rstrip("\n")
        finally:
            chan_out.channel.close()

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self.connect()
        with self._lock:
            if self._sftp is None:
                self._sftp = self._client.open_sftp()
        self._mkdirs(str(Path(path).parent))
        tmp = f"{path}.grpo-tmp"
        with self._sftp.open(tmp, "wb") as handle:
            handle.chmod(mode)
            handle.write(data)
        self._sftp.posix_rename(tmp, path)

    def _mkdirs(self, folder: str) -> None:
        result = self.run(["mkdir", "-p", "-m", "0700", folder])
        if not result.ok:
            raise HostError(self.name, f"cannot create {folder}: {result.line()}", "check the login user's rights")


class _SaveNewKey:
    """--accept-new-host-keys: an unknown key is added and saved (a changed key is still refused by paramiko)."""

    def __init__(self, path: str):
        self.path = path

    def missing_host_key(self, client, hostname, key) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        client.save_host_keys(self.path)


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def connect(spec_host, options: SshOptions | None = None) -> Host:
    """The connector for a spec host: local, or SSH (connected lazily, on first use)."""
    options = options or SshOptions()
    if spec_host.address == "local":
        return LocalHost(spec_host.name, command_cap_s=options.command_cap_s)
    return SshHost(spec_host.name, spec_host.address, options)


def on_all(hosts: list[Host], fn: Callable[[Host], Any], progress: Callable[[str], None] | None = None
           ) -> dict[str, Any]:
    """fn(host) on every host at once; {host name: result or the HostError it raised}."""
    results: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=max(len(hosts), 1)) as pool:
        futures = {pool.submit(fn, h): h for h in hosts}
        for future, host in futures.items():
            try:
                results[host.name] = future.result()
            except HostError as exc:
                results[host.name] = exc
            if progress:
                progress(host.name)
    return results


def chunks_of(stream, size: int = CHUNK, progress: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """A file-like object's bytes in chunks, reporting the running total."""
    total = 0
    last = time.time()
    while True:
        chunk = stream.read(size)
        if not chunk:
            break
        total += len(chunk)
        if progress and time.time() - last >= 1:
            progress(total)
            last = time.time()
        yield chunk
    if progress:
        progress(total)
