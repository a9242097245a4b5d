"""Tests of grpo_deploy.hosts.project: a run's compose project on a host; its strict container query says that the
engine did not answer instead of reporting no containers. The stalled engine is a stand-in `docker` on PATH that never
answers (named so: a real engine cannot be made to stall on cue)."""

from __future__ import annotations

import time

import pytest

from grpo_deploy.hosts.connect import HostError, LocalHost
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

