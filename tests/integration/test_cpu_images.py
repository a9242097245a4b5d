"""The rehearsal images pass their own in-image checks (`grpo-deploy images verify cpu verl-cpu`): the run user, the
share, the packages, and vLLM's CPU LoRA ops with the kit's plugin loaded by vLLM itself, a base-model token beside
an adapter token getting no LoRA (grpo_deploy/runtime/serving/cpu_lora_fix.py; on vLLM's CPU build without it the
base token reads the last adapter slot)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo_deploy.image_build import places

pytestmark = [pytest.mark.docker]


@pytest.mark.parametrize("recipe", ["cpu", "verl-cpu"])
def test_the_image_passes_its_checks_the_cpu_lora_fix_among_them(recipe, request):
    request.getfixturevalue("cpu_image" if recipe == "cpu" else "verl_image")  # built at most once a session
    log = places.build_dir() / "logs" / f"verify-{recipe}.log"
    start = log.stat().st_size if log.exists() else 0
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "images", "verify", recipe],
                          capture_output=True, text=True, timeout=600, check=False)
    with log.open(errors="replace") as handle:
        handle.seek(start)
        out = handle.read()
    assert proc.returncode == 0, proc.stdout + proc.stderr + out[-3000:]
    assert "vLLM CPU LoRA: base tokens get no adapter (plugin loaded, real ops checked)" in out, out[-3000:]
    assert "verify: all checks passed" in out
