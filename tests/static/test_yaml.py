"""yamllint (the repository's .yamllint) over the YAML this kit ships outside k8s/ and ansible/: compose files,
hardware profiles, the model table, golden specs and k8s overlay specs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["compose/compose.yaml", "compose/compose.nfs.yaml", "compose/compose.bind.yaml", "compose/compose.verl.yaml",
           "compose/compose.verl-cluster.yaml", "compose/compose.infiniband.yaml", "compose/compose.trainer-hosts.yaml",
           "compose/compose.trainer-infiniband.yaml",
           "grpo_deploy/profiles", "grpo_deploy/models.yaml", "tests/render"]


def test_yamllint_clean():
    for target in TARGETS:
        assert (ROOT / target).exists(), target
    proc = subprocess.run([sys.executable, "-m", "yamllint", "--strict", "-c", str(ROOT / ".yamllint"), *TARGETS],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
