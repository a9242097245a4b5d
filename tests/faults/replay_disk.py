"""Fault-suite helper for the seed-000 disk story, replayed by the TRL and the verl tests alike: a real tmpfs sized by
the plan's own estimate to hold three checkpoints but not four (the seed's disk held its saves of steps 20, 40 and
60, not 80), the specs on it (the seed's configuration: keep all, watchdog off; the guarded one: keep 2, watchdog on),
`plan` and preflight on the seed's spec, and the ballast that fills the disk mid-run as the seed's root volume
filled."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from grpo_deploy import plan, spec
from grpo_deploy.common.metrics import parse_events
from grpo_deploy.runtime.storage.checkpoints import list_checkpoints
from grpo_deploy.spec import resolve
from tests import compose
from tests.faults.running import cli
from tests.specs import spec_data

SEED_FAILING_SAVE = 4
UID = GID = 1000
UP_TIMEOUT_S = 900


def replay_spec(path: Path, engine: str, share: Path, volume: str, guarded: bool, save_every: int,
                steps_override: dict, run: str) -> Path:
    """The cpu profile's spec for *engine* on *share* (hosts[].shared_dir), saving every *save_every* steps; the
    seed's configuration, or with retention and the watchdog (*guarded*)."""
    data = spec_data("cpu", engine, (), **{
        "run.name": run, "storage.volume": volume, "hosts.0.shared_dir": str(share),
        "checkpoints.save_every": save_every, "checkpoints.keep": 2 if guarded else "all",
        "checkpoints.disk_watchdog": guarded, "checkpoints.disk_margin_gb": 0.0, "overrides": steps_override})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def resolved(path: Path):
    return resolve.resolve(spec.load(str(path)))


def guarded(run: dict) -> tuple:
    """The guarded spec's resolution, where its checkpoints are on the share, and the plan's checkpoint estimate
    (what the watchdog judges with)."""
    res = resolved(run["guarded"])
    estimate = plan.checkpoint_bytes(res, plan.Architecture.from_dict(res.architecture))[0]
    return res, on_share(run, res, res.checkpoint_dir), estimate


def seed_size(res) -> int:
    """Bytes that hold three checkpoints but not four by the plan's own estimate (plus its adapters): 3.5, rounded
    up to whole pages."""
    probe = plan.make_plan(res, free_bytes=1).disk
    arch = plan.Architecture.from_dict(res.architecture)
    sizes = [plan.checkpoint_bytes(res, arch, step)[0] for step in probe.save_steps]
    fixed = probe.adapter_bytes * probe.adapters_kept + probe.margin_bytes
    free = fixed + (sum(sizes[:SEED_FAILING_SAVE - 1]) + sum(sizes[:SEED_FAILING_SAVE])) // 2
    return -(-free // 4096) * 4096


@contextlib.contextmanager
def seed_tmpfs(tmp_path: Path, engine: str, run: str, save_every: int, steps_override: dict) -> Iterator[dict]:
    """A tmpfs the size the seed scenario needs, mounted on this host and owned by the run's user, with both specs
    on it and a fresh Docker volume name; everything started is stopped and the tmpfs unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    share = tmp_path / "share"
    share.mkdir()
    volume = f"grpo-replay-{secrets.token_hex(3)}"
    specs = {which: replay_spec(tmp_path / f"{which}.yaml", engine, share, volume, which == "guarded", save_every,
                                steps_override, run) for which in ("seed", "guarded")}
    size = seed_size(resolved(specs["seed"]))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},uid={UID},gid={GID},mode=0755", "tmpfs", str(share)],
                   check=True)
    try:
        yield {"cwd": tmp_path, "share": share, "size": size, "volume": volume, **specs, "spec": specs["seed"]}
    finally:
        for path in specs.values():
            subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "down", "-f", str(path)], cwd=tmp_path,
                           capture_output=True, timeout=300)
        subprocess.run(["umount", str(share)], check=False)
        for name in (volume, f"{volume}-cache"):  # made by compose for this test's spec only
            subprocess.run(["docker", "volume", "rm", "-f", name], capture_output=True, check=False)


def on_share(run: dict, res, container_path: str) -> Path:
    return run["share"] / os.path.relpath(container_path, res.spec.storage.mount)


def run_events(run: dict, res) -> list[dict]:
    path = on_share(run, res, f"{res.run_dir}/metrics.jsonl")
    return parse_events(path.read_text()) if path.exists() else []


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def up(run: dict, which: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "up", "-f", str(run[which]), *extra],
                          cwd=run["cwd"], capture_output=True, text=True, timeout=UP_TIMEOUT_S)


def kb(n: float) -> str:
    return f"{n / 1e3:,.0f} KB"


def plan_names_the_save_and_preflight_refuses(run: dict, docker_client, save_every: int, run_name: str) -> dict:
    """The seed's spec on the seed's disk: `plan` names the 4th save as the one that fails, and `up` stops in
    preflight at that step with nothing started. Returns plan's disk answer."""
    planned = cli(run, "plan", "--json")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    disk = json.loads(planned.stdout)["disk"]
    assert disk["filesystem"] == str(run["share"]) and abs(disk["free_bytes"] - run["size"]) <= 65536, disk
    assert (disk["fails_at_save"], disk["fails_at_step"]) == (SEED_FAILING_SAVE, SEED_FAILING_SAVE * save_every), disk
    refused = up(run, "seed", "--fresh")
    assert refused.returncode == 1 and "preflight failed: nothing was started" in refused.stdout, refused.stdout[-3000:]
    disk_row = next(line for line in refused.stdout.splitlines() if line.startswith("disk "))
    assert "FAIL" in disk_row and f"(step {disk['fails_at_step']})" in " ".join(refused.stdout.split()), \
        refused.stdout[-3000:]
    assert not compose.containers(docker_client, run_name), "preflight failed, yet containers exist"
    return disk


def fill_when(run: dict, ready: Callable[[], bool], estimate: int) -> tuple[threading.Thread, dict]:
    """A thread that, once *ready*() holds, writes a ballast file into the share's root (the test's own file, not in
    the kit's run directory) leaving room for an adapter sync but not for a checkpoint. The dict it fills says
    how much it wrote and what was left."""
    ballast = run["share"] / "ballast.bin"
    filled: dict = {"path": ballast}

    def fill() -> None:
        deadline = time.time() + UP_TIMEOUT_S
        while time.time() < deadline:
            if ready():
                size = max(free_bytes(run["share"]) - int(0.6 * estimate), 0)
                with open(ballast, "wb") as handle:
                    handle.write(b"\0" * size)
                filled.update(bytes=size, free_after=free_bytes(run["share"]), time=time.time())
                return
            time.sleep(0.05)

    thread = threading.Thread(target=fill, daemon=True)
    thread.start()
    return thread, filled


def complete_steps(directory: Path, layout: str) -> list[int]:
    return [c.step for c in list_checkpoints(str(directory), layout) if c.complete]
