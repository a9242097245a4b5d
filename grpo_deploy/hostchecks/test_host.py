"""Host checks, one per function, parametrized over the hosts testinfra was given (the cross-host probe picks its two
hosts by role). Every expected value is read from the resolved spec (`res`); a failure names the host, what was found,
what the spec wants and the fix."""

from __future__ import annotations

import os

import pytest

from grpo_deploy import preflight
from grpo_deploy.hostchecks import mounts
from grpo_deploy.hosts import facts as host_facts
from grpo_deploy.preflight import host as host_checks
from grpo_deploy.preflight import storage as storage_checks

DOCKER_SOCKET = "/var/run/docker.sock"


def _shared_dir(spec_host, res) -> str:
    if not spec_host.shared_dir:
        where = "the NFS share Docker mounts into each container" if res.spec.storage.nfs else \
            f"the Docker volume {res.spec.storage.volume}"
        pytest.skip(f"hosts[{spec_host.name}].shared_dir is not set: the run uses {where}")
    return spec_host.shared_dir


def _run_identity(res):
    """Who owns the run's files: the main role's identity (trainer, verl head) — run.uid/run.gid by default."""
    return res.main_identity


def _sh(conn, *argv: str):
    return conn.run(list(argv))


def _said(spec_host, result) -> str:
    """A preflight verdict (grpo_deploy.preflight) as this check's failure line."""
    return f"{spec_host.name}: {result.fact} -> {result.hint}" if result.hint else f"{spec_host.name}: {result.fact}"


def test_shared_dir_present(host, spec_host, res):
    path = _shared_dir(spec_host, res)
    f = host.file(path)
    assert f.exists, (f"{spec_host.name}: hosts[].shared_dir {path} does not exist -> mount the share there "
                      f"(or create it: mkdir -p {path}) on {spec_host.name}")
    assert f.is_directory, f"{spec_host.name}: hosts[].shared_dir {path} exists but is not a directory"


def test_shared_dir_owner(host, spec_host, res):
    path = _shared_dir(spec_host, res)
    ident = _run_identity(res)
    f = host.file(path)
    assert f.exists, f"{spec_host.name}: {path} does not exist (see shared_dir_present)"
    assert (f.uid, f.gid) == (ident.uid, ident.gid), (
        f"{spec_host.name}: {path} is owned by {f.uid}:{f.gid}; the run runs as {ident.uid}:{ident.gid} "
        f"(run.uid/run.gid) on every host -> chown {ident.uid}:{ident.gid} {path} (on NFS: the export's owner)")


def test_shared_dir_mode(host, spec_host, res):
    path = _shared_dir(spec_host, res)
    ident = _run_identity(res)
    f = host.file(path)
    assert f.exists, f"{spec_host.name}: {path} does not exist (see shared_dir_present)"
    mode = f.mode
    if f.uid == ident.uid:
        bits, who, letter = (mode >> 6) & 7, "owner", "u"
    elif f.gid == ident.gid:
        bits, who, letter = (mode >> 3) & 7, "group", "g"
    else:
        bits, who, letter = mode & 7, "others'", "o"
    assert bits == 7, (f"{spec_host.name}: {path} is mode {mode:04o}; the run user {ident.uid}:{ident.gid} gets the "
                       f"{who} bits ({bits:o}) and needs rwx (create run folders, write adapters) -> chmod "
                       f"{letter}+rwx {path}")


def test_nfs_mount(host, spec_host, res):
    nfs = res.spec.storage.nfs
    if nfs is None:
        pytest.skip("storage.nfs is not set")
    if not spec_host.shared_dir:
        pytest.skip("storage.nfs without hosts[].shared_dir: Docker mounts the share into each container at start; "
                    "nothing is mounted on the host")
    path = spec_host.shared_dir
    r = host.run("findmnt --json --mountpoint %s -o TARGET,SOURCE,FSTYPE,OPTIONS", path)
    found = mounts.parse_findmnt(r.stdout) if r.rc == 0 else None
    want = f"{nfs.server}:{nfs.export}"
    assert found is not None, (f"{spec_host.name}: nothing is mounted at {path} (storage.nfs wants {want} there) -> "
                               f"mount -t nfs -o {nfs.options} {want} {path}, and add it to /etc/fstab")
    assert (found.get("fstype") or "").startswith("nfs"), (
        f"{spec_host.name}: {path} is a {found.get('fstype')} mount of {found.get('source')}, not NFS "
        f"({want}) -> mount the share there")
    ips = set(host.run("getent ahosts %s", nfs.server).stdout.split()[::3]) if nfs.server else set()
    assert mounts.same_export(found.get("source") or "", nfs.server, nfs.export, ips), (
        f"{spec_host.name}: {path} mounts {found.get('source')}; storage.nfs is {want} -> mount {want} there")
    gaps = mounts.option_gaps(nfs.options, found.get("options") or "")
    assert not gaps, (f"{spec_host.name}: {path} is mounted without storage.nfs.options {', '.join(gaps)}; mounted "
                      f"with {found.get('options')} -> remount with -o {nfs.options}")


def test_login_user_can_use_docker(host, conn, spec_host):
    user = host.run("id -un").stdout.strip() or "?"
    sock = host.file(DOCKER_SOCKET)
    if sock.exists:
        r = host.run("test -r %s -a -w %s", DOCKER_SOCKET, DOCKER_SOCKET)
        groups = host.run("id -nG").stdout.split()
        assert r.rc == 0, (f"{spec_host.name}: the login user {user} cannot use {DOCKER_SOCKET} (owned "
                           f"{sock.user}:{sock.group}, mode {sock.mode:04o}; {user}'s groups: {' '.join(groups)}) -> "
                           f"usermod -aG {sock.group} {user}, then log in again")
        return
    version, why = host_facts.docker_version(conn)  # no socket there: DOCKER_HOST or a rootless engine
    assert version, f"{spec_host.name}: no {DOCKER_SOCKET} and `docker version` fails for {user}: {why}"


def test_docker_engine_answers(conn, spec_host):
    problem = host_checks.engine_problem(spec_host.name, host_facts.docker_version(conn))
    assert problem is None, _said(spec_host, problem)


def test_compose_v2_answers(conn, spec_host):
    problem = host_checks.compose_problem(spec_host.name, None, host_facts.compose_version(conn))
    assert problem is None, _said(spec_host, problem)


def _cuda(spec_host, res):
    profile = res.profiles[spec_host.name]
    if profile.accelerator != "cuda":
        pytest.skip(f"profile {profile.name} wants no CUDA (accelerator {profile.accelerator})")
    return profile


def test_nvidia_runtime(conn, spec_host, res):
    profile = _cuda(spec_host, res)
    runtimes = _sh(conn, "docker", "info", "--format", "{{json .Runtimes}}")
    cli = _sh(conn, "nvidia-container-cli", "--version")
    assert "nvidia" in runtimes.out or cli.ok, (
        f"{spec_host.name}: profile {profile.name} runs on NVIDIA GPUs but Docker has no NVIDIA runtime (runtimes "
        f"{runtimes.out.strip() or runtimes.line()}; nvidia-container-cli: {cli.line()}) -> install "
        "nvidia-container-toolkit, then nvidia-ctk runtime configure --runtime=docker and restart docker")


def test_gpus_visible(conn, spec_host, res):
    profile = _cuda(spec_host, res)
    gpus = host_facts.gpus(conn)
    verdict = host_checks.arch_verdict(spec_host, profile, {"machine": host_facts.machine(conn), "gpus": gpus})
    assert verdict.verdict != "fail", _said(spec_host, verdict)
    split = res.engine_info.gpu_split(res, spec_host)
    need = max((i for ids in split.values() for i in ids), default=0) + 1
    assert len(gpus) >= need, (f"{spec_host.name}: {len(gpus)} GPU(s) visible; the spec gives this host GPU indices "
                               f"{split} (hosts[].gpus or the profile's split) -> fix hosts[].gpus")


def _checkpoint_path(res, spec_host, conn) -> str | None:
    """Where the checkpoints land on this host's filesystem, or None when this host does not hold them."""
    if spec_host.shared_dir:
        return os.path.join(spec_host.shared_dir, os.path.relpath(res.checkpoint_dir, res.spec.storage.mount))
    if res.spec.storage.nfs is None and spec_host.name == res.host_for(res.engine_info.main_role).name:
        return host_facts.volume_mountpoint(conn, res.spec.storage.volume) or host_facts.docker_root(conn) or "/"
    return None


def test_checkpoint_disk_headroom(conn, spec_host, res):
    path = _checkpoint_path(res, spec_host, conn)
    if path is None:
        pytest.skip(f"checkpoints ({res.checkpoint_dir}) are not on a filesystem of {spec_host.name} that this check "
                    "can measure (an NFS share mounted by Docker: measure it on the NFS server)")
    free = host_facts.free_space(conn, path)
    assert free is not None, f"{spec_host.name}: df cannot measure {path}"
    storage_host = res.host_for(res.engine_info.main_role).name
    disk = preflight.Context(res, free_space={storage_host: free.free_bytes}).plan().disk
    if disk is None:
        pytest.skip(f"plan cannot size checkpoints of model {res.settings.model.path!r}: set model.architecture")
    gb = 1e9
    assert disk.fits, (f"{spec_host.name}: {free.free_bytes / gb:.1f} GB free on {free.path} (where {path} is), "
                       f"the run needs {disk.peak_bytes / gb:.1f} GB at peak ({'; '.join(disk.explanation[:2])}) -> "
                       f"{disk.explanation[-1]}")


def test_shared_dir_cross_host_write_read(res, on_host):
    """A real safetensors file (weights 0600, as adapters and checkpoints are saved) written as the main role's
    identity on its host is read as the reader role's identity on the reader's host, both in the run's images,
    through the real shared storage: preflight's shared-volume probe (preflight.storage.shared_volume_probe), run
    through testinfra's connectors."""
    engine = res.engine_info
    writer = res.host_for(engine.main_role)
    reader = res.host_for(engine.reader_role)
    if reader is None or reader.name == writer.name or len(res.spec.hosts) == 1:
        on_host(writer, label=writer.name)
        pytest.skip(f"shared_dir_cross_host_write_read: the spec has one host ({writer.name}) for "
                    f"{engine.main_role} and {engine.reader_role}: nothing crosses hosts")
    label = f"{writer.name}->{reader.name}"
    ctx = preflight.Context(res, connectors={writer.name: on_host(writer, label), reader.name: on_host(reader, label)})
    verdict = storage_checks.shared_volume_probe(ctx, engine.main_role, engine.reader_role)
    if verdict.verdict == "skip":
        pytest.skip(f"{verdict.fact} (the probe runs in the run's images) -> `grpo-deploy up` ships them, or docker "
                    "load them there")
    assert verdict.verdict == "ok", f"{label}: {verdict.fact} -> {verdict.hint}"
