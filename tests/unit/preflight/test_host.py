"""Tests of grpo_deploy.preflight.host: the arch check (this machine against a GPU profile), the port check from a
host's gathered facts, and the driver check: the host's NVIDIA driver (nvidia-smi) against the CUDA its images are
built with.

For the driver, the GPU is the one part faked: a stand-in `nvidia-smi` on PATH prints outputs from
tests/unit/nvidia_smi/ (one recorded on the H200 test machine; see the README there). The fact reader, the check and
the spec are real."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_deploy import preflight, spec
from grpo_deploy.hosts import facts as host_facts
from grpo_deploy.hosts.connect import LocalHost
from grpo_deploy.image_build import tags as image_tags
from grpo_deploy.preflight import host as checks_host
from grpo_deploy.spec import new_spec, resolve

OUTPUTS = Path(__file__).parents[1] / "nvidia_smi"
H200_TAG = image_tags.arch_tag("vllm", "amd64")
CPU = new_spec.spec_text("cpu", "trl-async")


def ctx_for(text: str, **kw) -> preflight.Context:
    return preflight.Context(resolve.resolve(spec.loads(text)), **kw)


def _only(ctx, name):
    return list(preflight.run_checks(ctx, only=[name]))


@pytest.fixture
def fake_gpu_nvidia_smi(tmp_path, monkeypatch):
    """Put a stand-in nvidia-smi first on PATH that answers the driver query with the named recorded output."""
    bindir = tmp_path / "fake-gpu-bin"
    bindir.mkdir()

    def install(name: str | None) -> None:
        script = bindir / "nvidia-smi"
        if name is None:
            script.unlink(missing_ok=True)
            monkeypatch.setenv("PATH", str(bindir))  # no nvidia-smi at all
            return
        script.write_text("#!/bin/sh\n"
                          'case "$*" in *--query-gpu=name,driver_version*) ;; *) exit 9 ;; esac\n'
                          f"cat '{OUTPUTS / name}'\n")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")

    return install


def test_driver_fact_reads_every_gpu(fake_gpu_nvidia_smi):
    fake_gpu_nvidia_smi("a100-r550.csv")
    drivers = host_facts.nvidia_driver(LocalHost("local"))
    assert [d.gpu for d in drivers] == ["NVIDIA A100-SXM4-80GB"] * 4
    assert {d.major for d in drivers} == {550}
    fake_gpu_nvidia_smi(None)
    assert host_facts.nvidia_driver(LocalHost("local")) is None


@pytest.mark.parametrize("output", ["h200-r580.csv", "gb10-r580.csv"])
def test_r580_runs_cuda_13(fake_gpu_nvidia_smi, output):
    fake_gpu_nvidia_smi(output)
    r = checks_host.driver_verdict("h", host_facts.nvidia_driver(LocalHost("local")), ("13.0", "its label"), H200_TAG)
    assert r.verdict == "ok" and "needs R580+" in r.fact


def test_old_datacenter_driver_fails_naming_both_ways_out(fake_gpu_nvidia_smi):
    fake_gpu_nvidia_smi("h200-r570.csv")
    drivers = host_facts.nvidia_driver(LocalHost("local"))
    r = checks_host.driver_verdict("h200a", drivers, ("13.0", "its label"), H200_TAG)
    assert r.verdict == "fail" and "570.133.20" in r.fact and "R580" in r.fact
    assert "upgrade the NVIDIA driver to R580" in r.hint and "VLLM_ENABLE_CUDA_COMPATIBILITY=1" in r.hint
    warned = checks_host.driver_verdict("h200a", drivers, ("13.0", "its label"), H200_TAG, compat_env=True)
    assert warned.verdict == "warn" and "forward compatibility" in warned.fact


def test_old_driver_without_forward_compatibility_can_only_upgrade(fake_gpu_nvidia_smi):
    fake_gpu_nvidia_smi("gb10-r570.csv")
    r = checks_host.driver_verdict("spark1", host_facts.nvidia_driver(LocalHost("local")), ("13.0", "its label"),
                                 image_tags.arch_tag("vllm", "arm64"), compat_env=True)
    assert r.verdict == "fail" and "VLLM_ENABLE_CUDA_COMPATIBILITY" not in r.hint and "R580" in r.hint


def test_cuda_12_image_runs_on_r550(fake_gpu_nvidia_smi):
    fake_gpu_nvidia_smi("a100-r550.csv")
    r = checks_host.driver_verdict("a", host_facts.nvidia_driver(LocalHost("local")), ("12.9", "its label"), "x:y")
    assert r.verdict == "ok"


def test_no_driver_fails():
    r = checks_host.driver_verdict("h", None, ("13.0", "its label"), H200_TAG)
    assert r.verdict == "fail" and "nvidia-smi" in r.fact


def test_cpu_profile_is_skipped():
    ctx = preflight.Context(resolve.resolve(spec.loads(new_spec.spec_text("cpu", "trl-async"))))
    (r,) = preflight.run_checks(ctx, only=["driver"])
    assert r.verdict == "skip" and "no GPU" in r.fact


def test_check_reads_this_hosts_driver_and_the_images_cuda(fake_gpu_nvidia_smi):
    """An h200 spec on this machine: the driver from nvidia-smi, the CUDA from the image's label or, while the image
    is not built here, from the kit's image table for its tag."""
    fake_gpu_nvidia_smi("h200-r570.csv")
    ctx = preflight.Context(resolve.resolve(spec.loads(new_spec.spec_text("h200", "trl-async"))))
    results = preflight.run_checks(ctx, only=["driver"])
    assert {r.verdict for r in results} == {"fail"}
    assert len(results) == 2  # the server and the trainer image on the one host
    assert all("CUDA 13.0" in r.fact and "570.133.20" in r.fact for r in results)
    fake_gpu_nvidia_smi("h200-r580.csv")
    ctx = preflight.Context(resolve.resolve(spec.loads(new_spec.spec_text("h200", "trl-async"))))
    assert {r.verdict for r in preflight.run_checks(ctx, only=["driver"])} == {"ok"}


def test_arch_mismatch_fails_for_gpu_profile_here():
    """This machine has no NVIDIA GPU: an h200 profile on the local host must fail the arch check."""
    import os

    (r,) = _only(ctx_for(new_spec.spec_text("h200", "trl-async")), "arch")
    if os.uname().machine == "x86_64":
        assert r.verdict == "fail" and "GPU" in r.fact
    else:
        assert r.verdict == "fail" and "x86_64" in r.fact


def test_port_check_refuses_a_run_with_running_containers():
    """The verdict from the server host's gathered facts (the gathering runs in every real preflight: integration)."""
    ctx = ctx_for(CPU)
    ctx._facts = {"local": {"running": ["grpo-rehearsal-server-1"], "listening": {8000: True}}}
    (r,) = _only(ctx, "port")
    assert r.verdict == "fail" and "grpo-rehearsal-server-1" in r.fact and "grpo-deploy down" in r.hint
    ctx._facts = {"local": {"running": [], "listening": {8000: True}}}
    (r,) = _only(ctx, "port")
    assert r.verdict == "fail" and "already listens on port 8000" in r.fact
    ctx._facts = {"local": {"running": [], "listening": {8000: None}}}
    assert _only(ctx, "port")[0].verdict == "warn"
    ctx._facts = {"local": {"running": [], "listening": {8000: False}}}
    assert _only(ctx, "port")[0].verdict == "ok"
    ctx._facts = {"local": {"running": [], "listening": {8000: False, 8001: True}}}  # a second replica's port
    (r,) = _only(ctx, "port")
    assert r.verdict == "fail" and "already listens on port 8001 there (the replicas publish ports 8000-8001)" in r.fact
