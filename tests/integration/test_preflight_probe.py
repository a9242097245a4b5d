"""The Spark field run's failure caught before training: a trainer writing adapters as another UID with umask 077 is
refused by preflight (real probe through the real shared volume), naming UID, umask and path; nothing is started.
(Root as the trainer, the field run's case, is refused earlier: the spec allows no UID 0.)"""

from __future__ import annotations

import subprocess
import sys

from grpo_deploy.spec import new_spec
from tests import compose as compose_mod

RUN = "probe-split"


def _spec(tmp_path, roles: str) -> str:
    text = new_spec.spec_text("cpu", "trl-async", run_name=RUN).replace("  roles: {}", f"  roles: {roles}")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return str(path)


def _preflight(tmp_path, spec_path, *args):
    return subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "preflight", "-f", spec_path, *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_probe_passes_with_one_identity(tmp_path, cpu_image):
    proc = _preflight(tmp_path, _spec(tmp_path, "{}"), "--only", "shared-volume", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"verdict": "ok"' in proc.stdout


def test_other_uid_trainer_with_umask_077_is_refused_by_the_real_probe(tmp_path, cpu_image):
    spec_path = _spec(tmp_path, "{trainer: {uid: 2000, gid: 2000, umask: '0077'}}")
    proc = _preflight(tmp_path, spec_path, "--only", "shared-volume", "--only", "identity")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "UID 2000:2000" in out and "umask 0077" in out and f"/shared/runs/{RUN}/" in out
    assert "does not expose" in out  # names TRL's misleading message as what this prevents
    rows = [line for line in proc.stdout.splitlines() if line.startswith("shared-volume")]
    assert rows and "FAIL" in rows[0], proc.stdout  # the real probe, not only the rule


def test_up_refuses_and_starts_nothing(tmp_path, cpu_image, docker_client):
    spec_path = _spec(tmp_path, "{trainer: {uid: 2000, gid: 2000, umask: '0077'}}")
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "up", "-f", spec_path], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "nothing was started" in proc.stdout
    assert compose_mod.containers(docker_client, RUN) == []


def test_an_nfs_share_that_cannot_be_mounted_is_named_as_the_cause(tmp_path, cpu_image):
    """storage.nfs left in a spec where no NFS can be mounted: the engine's own error (the failed mount), not docker's
    usage hint, and a fix about the NFS share, not about directory permissions."""
    path = tmp_path / "spec.yaml"
    path.write_text(new_spec.spec_text("cpu", "trl-async", run_name=RUN).replace(
        "  nfs: null ", "  nfs: {server: 127.0.0.1, export: /export/grpo}"))
    proc = _preflight(tmp_path, str(path), "--only", "shared-volume")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "cannot start" in out and "failed to mount local volume" in out, proc.stdout
    assert "storage.nfs 127.0.0.1:/export/grpo could not be mounted" in out, proc.stdout
    assert "docker run --help" not in out and "writable by UID" not in out, proc.stdout
