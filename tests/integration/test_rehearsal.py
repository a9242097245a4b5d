"""The real CPU rehearsal end to end: `grpo-deploy up` with the embedded default spec starts the real vLLM CPU
server and the real TRL async trainer in containers, as the non-root run user, and the reward rises. The run is
started with a planted HF token and W&B key in its environment: they must reach the containers that need them and
nothing else (rendered files, logs, process command lines, the volume, `docker inspect` beyond the environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from grpo_deploy.hosts import oneoff
from grpo_deploy.hosts.connect import LocalHost
from grpo_deploy.spec import new_spec, resolve
from tests import compose as compose_mod

RUN = "rehearsal"
# Planted, not real: long enough for the kit's secret detection, unique enough to grep for.
PLANTED = {"HF_TOKEN": "hf_plantedTokenNotReal9f3a7c", "WANDB_API_KEY": "plantedwandbkey0123456789abcdef0123456789"}


class CommandLineSampler:
    """Reads every process's command line on this machine (containers' processes included: one kernel) twice a
    second while `up` runs, keeping those that carry a planted secret."""

    def __init__(self):
        self.leaks: set[str] = set()
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.wait(0.5):
            self.samples += 1
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if any(value in text for value in PLANTED.values()):
                    self.leaks.add(text[:300])


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, cpu_image, docker_client):
    """One full `grpo-deploy up --fresh` (the README's main command), from a scratch working directory."""
    cwd = tmp_path_factory.mktemp("rehearsal")
    sampler = CommandLineSampler()
    sampler.thread.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "up", "--fresh", "--keep"], cwd=cwd,
                              capture_output=True, text=True, timeout=1800, env={**os.environ, **PLANTED})
    finally:
        sampler.stop.set()
        sampler.thread.join()
    print(proc.stdout[-6000:])
    print(proc.stderr[-3000:], file=sys.stderr)
    status = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "status", "--json"], cwd=cwd,
                            capture_output=True, text=True, timeout=120)
    yield {"cwd": cwd, "up": proc, "status": json.loads(status.stdout) if status.returncode == 0 else {},
           "state": cwd / ".grpo-deploy" / RUN, "sampler": sampler}
    subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "down"], cwd=cwd, capture_output=True, timeout=300)


def test_up_exits_zero(rehearsal):
    assert rehearsal["up"].returncode == 0, rehearsal["up"].stdout[-3000:] + rehearsal["up"].stderr[-3000:]


def test_at_least_30_steps_and_every_adapter_load_ok(rehearsal):
    s = rehearsal["status"]
    assert s["steps"] >= 30
    assert s["adapter_loads_failed"] == 0
    assert s["adapter_loads_ok"] >= s["steps"]  # weight_sync_steps 1: at least one load per step


def test_reward_rises_clearly(rehearsal):
    s = rehearsal["status"]
    assert s["reward_last5"] > s["reward_first5"] + 0.1, (s["reward_first5"], s["reward_last5"])


def test_containers_ran_as_the_non_root_run_user(rehearsal, docker_client):
    s = rehearsal["status"]
    assert s["run_uid"] == 1000 and s["run_gid"] == 1000
    for role in ("server", "trainer"):
        (c,) = compose_mod.containers(docker_client, RUN, role)
        assert c.attrs["Config"]["User"] == "1000:1000"


def test_adapters_on_the_volume_are_readable_by_the_server_uid(rehearsal, docker_client):
    res = resolve.resolve(new_spec.embedded_default())
    script = ("import os,sys; bad=[]; n=0\n"
              f"for root,_,files in os.walk('{res.checkpoint_dir}'):\n"
              "  for f in files:\n"
              "    p=os.path.join(root,f); n+=1\n"
              "    try: open(p,'rb').read(1)\n"
              "    except OSError as e: bad.append(p)\n"
              "print(n, len(bad)); sys.exit(1 if bad or n == 0 else 0)")
    r = oneoff.run(LocalHost(), res.images["server"], ["python", "-c", script], ident=res.identities["server"],
                   share=(res, None))
    assert r.ok, r.out + r.err


def test_summary_and_plot_written(rehearsal):
    state = rehearsal["state"]
    summary = json.loads((state / "summary.json").read_text())
    assert summary["steps"] >= 30
    png = state / f"{RUN}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = rehearsal["up"].stdout
    assert "reward" in out and "hand-off" in out and "up -> first step" in out


def test_up_is_quiet_before_the_first_optimizer_step(rehearsal):
    """A few dozen lines before the first step, on both streams: no pip, apt or docker build output comes through."""
    lines = (rehearsal["up"].stdout + rehearsal["up"].stderr).splitlines()
    first = next(i for i, line in enumerate(lines) if "] step 1/" in line)
    assert first <= 40, "\n".join(lines[:first])
    noisy = [line for line in lines if line.startswith(("Step ", " ---> ", "Collecting ", "Get:", "Unpacking "))]
    assert noisy == []
    summary = json.loads((rehearsal["state"] / "summary.json").read_text())
    assert summary["images_build_s"] == 0.0, "the image was built before `up`: no build time inside it"


def test_status_json_has_the_contract_fields(rehearsal):
    s = rehearsal["status"]
    for key in ("steps", "reward_first5", "reward_last5", "adapter_loads_ok", "adapter_loads_failed",
                "median_handoff_s", "up_to_first_step_s", "server_ready_s", "run_uid"):
        assert s.get(key) is not None, key


def test_checkpoints_of_the_run_listed_and_verified(rehearsal):
    """`grpo-deploy checkpoints` reads the real TRL checkpoints on the volume, in a container of the run's image."""
    res = resolve.resolve(new_spec.embedded_default())

    def checkpoints(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "checkpoints", *args], cwd=rehearsal["cwd"],
                              capture_output=True, text=True, timeout=300)

    listed = checkpoints("list", "--json")
    assert listed.returncode == 0, listed.stderr
    answer = json.loads(listed.stdout)
    found = answer["checkpoints"]
    assert answer["layout"] == "trl" and answer["directory"] == res.checkpoint_dir and found
    assert all(c["state"] == "complete" and c["size_bytes"] > 0 for c in found)
    assert {c["lora_r"] for c in found} == {res.settings.lora.r} and {c["world_size"] for c in found} == {1}
    assert len(found) <= res.keep  # TRL's own retention held
    assert checkpoints("verify").returncode == 0
    dry = checkpoints("prune", "--keep", "1", "--dry-run", "--json")
    assert dry.returncode == 0 and [c["step"] for c in json.loads(dry.stdout)["kept"]] == [found[-1]["step"]]


def planted_in(text: str) -> list[str]:
    return [name for name, value in PLANTED.items() if value in text]


def test_planted_secrets_reach_only_the_environments_that_need_them(rehearsal, docker_client):
    for role, wanted in (("server", {"HF_TOKEN"}), ("trainer", {"HF_TOKEN", "WANDB_API_KEY"})):
        (c,) = compose_mod.containers(docker_client, RUN, role)
        env = dict(item.partition("=")[::2] for item in c.attrs["Config"]["Env"])
        assert {name for name in PLANTED if env.get(name) == PLANTED[name]} == wanted, role
        rest = {k: v for k, v in c.attrs.items() if k != "Config"}
        config = {k: v for k, v in c.attrs["Config"].items() if k != "Env"}
        assert planted_in(json.dumps(rest)) == [] and planted_in(json.dumps(config)) == [], role
        assert planted_in(c.logs().decode(errors="replace")) == [], f"{role} log"


def test_planted_secrets_never_in_files_output_or_command_lines(rehearsal, docker_client):
    sampler = rehearsal["sampler"]
    assert sampler.samples > 100, "the command-line sampler did not run through the rehearsal"
    assert sampler.leaks == set()
    up = rehearsal["up"]
    assert planted_in(up.stdout + up.stderr) == []
    scanned = 0
    for path in rehearsal["cwd"].rglob("*"):  # rendered config, compose env files, deploy log, metrics copy
        if path.is_file():
            scanned += 1
            assert planted_in(path.read_bytes().decode(errors="replace")) == [], path
    assert scanned >= 5
    res = resolve.resolve(new_spec.embedded_default())
    r = oneoff.run(LocalHost(), res.images["trainer"],
                   ["grep", "-rlaF", "-e", PLANTED["HF_TOKEN"], "-e", PLANTED["WANDB_API_KEY"], res.spec.storage.mount],
                   ident=res.identities["trainer"], share=(res, None))
    assert r.rc == 1 and r.out.strip() == "", r.out + r.err  # grep: 1 = nothing found, 2 = error
