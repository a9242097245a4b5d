"""Tests of grpo_deploy.hosts.project: a run's compose project on a host; its strict container query says that the
engine did not answer instead of reporting no containers; a file read back from a container is bounded and only a
regular file. The stalled engine is a stand-in `docker` on PATH that never answers (named so: a real engine cannot be
made to stall on cue)."""

from __future__ import annotations

import io
import tarfile
import time

import pytest

from grpo_deploy.common.readback import ReadRefused
from grpo_deploy.hosts.connect import HostError, LocalHost, Result
from grpo_deploy.hosts.project import RemoteProject


@pytest.fixture()
def stalled_docker(tmp_path, monkeypatch):
    """A `docker` that hangs like an engine busy with a container's lock."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_a_strict_query_on_a_stalled_engine_names_it(stalled_docker):
    project = RemoteProject(LocalHost("spark2", command_cap_s=1), "/nonexistent", "run1")
    start = time.monotonic()
    with pytest.raises(HostError) as info:
        project.containers(strict=True)
    assert "spark2" in str(info.value) and "docker ps" in str(info.value) and "within 1 s" in str(info.value)
    assert time.monotonic() - start < 5
    assert project.containers() == []  # the lenient query (up's loops) still counts it as none



def _tar_of(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, size: int | None = None) -> bytes:
    """What `docker cp CONTAINER:PATH -` writes: a tar of the one file (*size*: what its header claims)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/shadow"
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    raw = out.getvalue()
    if size is not None:  # the header's size field, as a container's huge file would give it (octal, NUL-ended)
        header = bytearray(raw[:512])
        header[124:136] = f"{size:011o}\0".encode()
        header[148:156] = b" " * 8
        header[148:155] = f"{sum(header):06o}\0".encode()
        raw = bytes(header) + raw[512:]
    return raw


class _Answers(LocalHost):
    def __init__(self, raw: bytes):
        super().__init__("spark1")
        self.raw = raw

    def run(self, argv, *, stdin=None, timeout=120):
        return Result(0, "", "", self.raw)


def test_a_containers_file_is_read_back_bounded_and_only_as_a_regular_file():
    def read(raw: bytes, **kw) -> str | None:
        return RemoteProject(_Answers(raw), "/r", "run1").read("c0ffee" * 6, "/x/metrics.jsonl", **kw)

    assert read(_tar_of("metrics.jsonl", b'{"event": "a"}\n')) == '{"event": "a"}\n'
    with pytest.raises(ReadRefused) as refused:
        read(_tar_of("metrics.jsonl", b"x" * 100), limit=10)
    assert refused.value.kind == "too-big"
    assert "/x/metrics.jsonl in container c0ffeec0ffee on spark1" in str(refused.value)
    with pytest.raises(ReadRefused) as refused:  # the header says 300 MiB: refused before a byte of it is read
        read(_tar_of("metrics.jsonl", b"x" * 10, size=300 << 20))
    assert refused.value.kind == "too-big" and str(300 << 20) in str(refused.value)
    with pytest.raises(ReadRefused) as refused:
        read(_tar_of("metrics.jsonl", kind=tarfile.SYMTYPE))
    assert refused.value.kind == "link" and "\n" not in str(refused.value)
    with pytest.raises(ReadRefused) as refused:
        read(_tar_of("metrics.jsonl", kind=tarfile.DIRTYPE))
    assert refused.value.kind == "not-regular"


def test_put_writes_the_token_0600_in_a_0700_folder_and_the_render_never_holds_it(tmp_path):
    """The run's token reaches a host only as secret/run-token.env (GRPO_RUN_TOKEN=..., 0600, in a 0700 folder): the
    render put beside it (config/, hosts/) and the compose files never hold it, and hosts/<host>.env names its path."""
    import os

    from grpo_deploy import render, spec
    from grpo_deploy.runtime import run_token
    from grpo_deploy.spec import resolve
    from tests.specs import spec_yaml

    res = resolve.resolve(spec.loads(spec_yaml("cpu", "trl-async", ("local",)), source="s.yaml"))
    root = tmp_path / "run"
    project = RemoteProject(LocalHost("local"), str(root), res.spec.run.name)
    token = run_token.make()
    project.put(render.render_files(res, config_dir=project.config_dir), token)
    secret = root / "secret" / "run-token.env"
    assert project.token_file == str(secret) and secret.read_text() == f"GRPO_RUN_TOKEN={token}\n"
    assert os.stat(secret).st_mode & 0o777 == 0o600 and os.stat(secret.parent).st_mode & 0o777 == 0o700
    holding = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and token in p.read_text()]
    assert holding == ["secret/run-token.env"]
    assert f"GRPO_RUN_TOKEN_FILE={secret}" in (root / "render" / "hosts" / "local.env").read_text()
    (secret.parent).chmod(0o755)  # a later put makes it private again
    project.put({}, token)
    assert os.stat(secret.parent).st_mode & 0o777 == 0o700
