"""The kit as a user installs it: a wheel built from this checkout, installed into a fresh virtualenv (no system
site-packages) in a folder outside the checkout, runs `init`, `render`, `plan`, `preflight` and the cpu `up` from a
working directory that is not the checkout, finds compose/ and images/ in its installed package, and writes nothing
into that package.

The cpu image: a tag of its own, built first from the checkout on the existing dependency image (the code layer only,
seconds to a minute) with `grpo-deploy images build`; the wheel's `up` then builds the same tag in-process from its
packaged images/, and must find it current (the input hash does not change because the files were copied into a
wheel). A run name, volume and port of its own keep it apart from other runs on the engine; it trains 4 steps, and
everything it created is removed."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import REPO

pytestmark = [pytest.mark.docker, pytest.mark.slow]

MAX_STEPS = 4
SUFFIX = uuid.uuid4().hex[:8]
RUN = f"wheel-test-{SUFFIX}"
VOLUME = f"grpo-wheel-test-{SUFFIX}"
TAG = f"grpo-deploy/cpu:wheel-test-{SUFFIX}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file below root: relative path -> (size, mtime in ns)."""
    out = {}
    for path in root.rglob("*"):
        if path.is_file() or path.is_symlink():
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _checkout_files() -> list[str]:
    """What a commit of the working tree would hold: tracked files plus untracked ones git does not ignore."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout.decode()
    return sorted(p for p in set(out.split("\0")) if p and (REPO / p).is_file())


def _build_wheel(scratch: Path) -> Path:
    """`pip wheel` (offline: no build isolation) from a copy of the checkout, so the build writes nothing into it."""
    src, dist = scratch / "src", scratch / "dist"
    for rel in _checkout_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("grpo_deploy-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(docker_client):
    """Wheel -> fresh venv -> the five verbs from a scratch working dir; yields what each step produced."""
    scratch = Path(tempfile.mkdtemp(prefix="grpo-wheel-test-"))
    assert not scratch.resolve().is_relative_to(REPO.resolve())
    venv, work, cache = scratch / "venv", scratch / "work", scratch / "cache"
    work.mkdir()
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "GRPO_BUILD_DIR")  # nothing of this checkout leaks in
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), XDG_CACHE_HOME=str(cache))
    figures: dict[str, float] = {}
    out: dict = {"scratch": scratch, "venv": venv, "work": work, "cache": cache, "figures": figures, "steps": {}}

    def timed(name: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
        start = time.time()
        proc = subprocess.run(argv, capture_output=True, text=True, **kw)
        figures[f"{name}_s"] = round(time.time() - start, 1)
        return proc

    def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = timed(args[0], [str(venv / "bin" / "grpo-deploy"), *args], cwd=work, env=env, timeout=timeout)
        out["steps"][args[0]] = proc
        return proc

    try:
        start = time.time()
        out["wheel"] = _build_wheel(scratch)
        figures["wheel_build_s"] = round(time.time() - start, 1)
        figures["wheel_bytes"] = out["wheel"].stat().st_size
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=300)
        proc = timed("install", [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(out["wheel"])],
                     env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        where = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import json, sysconfig, grpo_deploy.kit_data as k; print(json.dumps("
             "{'purelib': sysconfig.get_paths()['purelib'], 'package': str(k.PACKAGE_DIR), "
             "'compose': str(k.kit_dir('compose')), 'images': str(k.kit_dir('images'))}))"],
            cwd=work, env=env, check=True, capture_output=True, text=True)
        out["where"] = json.loads(where.stdout)
        site = Path(out["where"]["purelib"])
        out["site_before"] = _tree(site)

        # The image tag, built from the checkout the way `make images` does (code layer only).
        proc = timed("checkout_build",
                     [sys.executable, "-m", "grpo_deploy.cli", "images", "build", "cpu", "--tag", TAG],
                     env={**env, "PYTHONPATH": str(REPO), "GRPO_BUILD_DIR": str(scratch / "checkout-build")},
                     cwd=REPO, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out["image_id_before"] = docker_client.images.get(TAG).id

        spec_path = work / "spec.yaml"
        cli("init", "--profile", "cpu", "--engine", "trl-async", "-o", spec_path.name)
        if spec_path.exists():
            spec = yaml.safe_load(spec_path.read_text())
            spec["run"]["name"] = RUN
            spec["storage"]["volume"] = VOLUME
            spec["images"].update(server=TAG, trainer=TAG)
            spec["overrides"] = {"trl": {"max_steps": MAX_STEPS}, "vllm": {"port": _free_port()}}
            spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
            cli("render", "-f", spec_path.name, "-o", "rendered")
            cli("plan", "-f", spec_path.name)
            cli("preflight", "-f", spec_path.name)
            cli("up", "-f", spec_path.name, timeout=1800)
            cli("status", "-f", spec_path.name, "--json")
        out["site_after"] = _tree(site)
        out["image_id_after"] = docker_client.images.get(TAG).id
        print(json.dumps(figures))
        for name, proc in out["steps"].items():
            print(f"--- {name}: exit {proc.returncode}\n{proc.stdout[-2500:]}\n{proc.stderr[-1500:]}")
        yield out
    finally:
        if (work / "spec.yaml").exists():
            subprocess.run([str(venv / "bin" / "grpo-deploy"), "down", "-f", "spec.yaml", "--volumes"], cwd=work,
                           env=env, capture_output=True, timeout=300)
        for name in (VOLUME, f"{VOLUME}-cache"):  # this test's volumes only
            subprocess.run(["docker", "volume", "rm", name], capture_output=True, timeout=120)
        subprocess.run(["docker", "image", "rm", TAG], capture_output=True, timeout=120)
        shutil.rmtree(scratch, ignore_errors=True)


def test_the_wheel_ships_every_file_of_the_kit(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    wanted = {rel for rel in _checkout_files() if rel.startswith("grpo_deploy/")}
    wanted |= {f"grpo_deploy/kit/{rel}" for rel in _checkout_files() if rel.split("/")[0] in ("compose", "images")}
    assert {"grpo_deploy/kit/compose/compose.yaml", "grpo_deploy/kit/images/base.sh",
            "grpo_deploy/kit/images/cpu/Dockerfile"} <= wanted
    assert sorted(wanted - names) == []


def test_the_installed_package_is_the_one_that_runs_and_finds_its_own_data(installed):
    where, venv = installed["where"], installed["venv"].resolve()
    assert Path(where["package"]).is_relative_to(venv)
    assert Path(where["compose"]) == Path(where["package"]) / "kit" / "compose"
    assert Path(where["images"]) == Path(where["package"]) / "kit" / "images"


@pytest.mark.parametrize("verb", ["init", "render", "plan", "preflight", "up", "status"])
def test_each_verb_exits_zero_outside_the_checkout(installed, verb):
    proc = installed["steps"].get(verb)
    assert proc is not None, f"{verb} did not run (an earlier verb failed)"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_render_wrote_the_run_files(installed):
    rendered = installed["work"] / "rendered"
    assert (rendered / "hosts" / "local.env").is_file() and (rendered / "config" / "trainer.yaml").is_file()


def test_up_reached_its_optimizer_steps(installed):
    summary = json.loads((installed["work"] / ".grpo-deploy" / RUN / "summary.json").read_text())
    assert summary["steps"] == MAX_STEPS
    assert summary["adapter_loads_failed"] == 0 and summary["adapter_loads_ok"] >= MAX_STEPS
    status = json.loads(installed["steps"]["status"].stdout)
    assert status["steps"] == MAX_STEPS


def test_the_packaged_build_found_the_checkout_built_image_current(installed):
    # Same inputs hashed from the wheel's copy as from the checkout: no rebuild, the image is the one built before.
    assert installed["image_id_after"] == installed["image_id_before"]


def test_nothing_was_written_into_the_installed_package(installed):
    before, after = installed["site_before"], installed["site_after"]
    assert sorted(set(after) - set(before)) == []
    assert sorted(k for k in before if after.get(k) != before[k]) == []


def test_build_state_went_to_the_users_cache_dir(installed):
    assert (installed["cache"] / "grpo-deploy" / "build").is_dir()
