"""The trainer speed switches inside the arm64 trainer image under QEMU user emulation (tests/arm64_switches.py says
what this shows and what it cannot). Not in `make test`: the image takes about 25 minutes to build under emulation
when missing, and the bench runs on one emulated core; `make test-arm64-switches` runs it and records the result."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from grpo_deploy.hosts import docker_api
from grpo_deploy.image_build import places
from grpo_deploy.image_build.recipes import RECIPES
from grpo_deploy.image_build.verify import emulation_options
from grpo_deploy.names import MANAGED_BY_LABEL
from tests import arm64_switches

pytestmark = [pytest.mark.docker, pytest.mark.arm64_switches]

RECIPE = RECIPES[arm64_switches.RECIPE]
BENCH_TIMEOUT = 5400


@pytest.fixture(scope="module")
def trainer_image(docker_client) -> str:
    """The arm64 trainer image: reused when its inputs are unchanged, else built under QEMU (the dependency image
    alone takes about 25 minutes of one emulated core)."""
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "images", "build", RECIPE.name],
                          capture_output=True, text=True, timeout=3600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert docker_client.images.get(RECIPE.tag).attrs["Architecture"] == "arm64"
    return RECIPE.tag


@pytest.fixture(scope="module")
def report(docker_client, trainer_image, tmp_path_factory) -> dict:
    """The bench's JSON report, run in a throw-away container of the image (at nice 19), the checkout's code mounted
    over the image's; kept in the build folder for `python -m tests.arm64_switches --record`."""
    out = tmp_path_factory.mktemp("arm64-switches")
    out.chmod(0o777)  # the image's run user writes the report
    log_dir = places.build_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    image = docker_client.images.get(trainer_image)
    options = emulation_options(docker_client, image, log_dir)
    assert options, "the arm64 image must run under emulation here (an arm64 host needs no stand-in)"
    options["volumes"] |= {str(arm64_switches.ROOT / "grpo_deploy"): {
                               "bind": f"{arm64_switches.KIT_MOUNT}/grpo_deploy", "mode": "ro"},
                           str(out): {"bind": arm64_switches.OUT_MOUNT, "mode": "rw"}}
    command = ["nice", "-n", "19", *arm64_switches.bench_argv(f"{arm64_switches.OUT_MOUNT}/report.json")]
    started = time.monotonic()
    container = docker_api.for_work(docker_client).containers.run(
        trainer_image, command, detach=True, **options, labels={MANAGED_BY_LABEL: "grpo-deploy-tests"},
        environment=arm64_switches.ENVIRONMENT)
    try:
        with (log_dir / "arm64-switches.log").open("wb") as log:
            for chunk in container.logs(stream=True, follow=True):
                log.write(chunk)
                log.flush()  # the run takes many minutes: its progress readable while it runs
        code = container.wait(timeout=BENCH_TIMEOUT).get("StatusCode", 1)
    finally:
        container.remove(force=True)
    wall = time.monotonic() - started
    tail = (log_dir / "arm64-switches.log").read_text(errors="replace")[-4000:]
    assert code == 0, f"bench exit {code} under emulation:\n{tail}"
    saved = arm64_switches.report_path()
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text((out / "report.json").read_text())
    saved.with_name("wall_s").write_text(f"{wall:.1f}\n")
    return json.loads(saved.read_text())


def test_the_bench_ran_on_arm64(report):
    assert report["machine"] == "aarch64" and report["device"] == "cpu"
    assert report["versions"]["torch"].startswith("2.13.0"), report["versions"]


def test_each_switch_runs_or_says_why_not(report):
    speed = {r["switches"]: r for r in report["speed"]}
    assert set(speed) == set(arm64_switches.ROWS.split(";"))
    for label in ("today", "compile+lora-ew"):
        row = speed[label]
        assert "skipped" not in row and "failure" not in row, row
        assert row["tokens_per_s"] > 0 and row["recompiles_in_step"] == 0, row
        assert (row["graphs_warmup"] > 0) == (label != "today"), row
    for label in ("bf16-linear", "bf16", "bf16+compile+lora-ew"):  # CPU times fp32; exactness runs them in bf16
        assert "needs bf16 autocast" in speed[label]["skipped"], speed[label]
    assert "need a CUDA device" in speed["liger"]["skipped"]


def test_each_runnable_switch_is_exact_under_bf16_autocast(report):
    checked = {r["switches"]: r for r in report["exactness"]["rows"]}
    assert set(checked) == set(arm64_switches.ROWS.split(";"))
    assert "need a CUDA device" in checked["liger"]["skipped"]
    for label, row in checked.items():
        if label != "liger":
            assert row.get("exact"), row

