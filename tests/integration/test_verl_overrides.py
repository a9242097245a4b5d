"""The GPU profiles' verl overrides against verl's real configuration: the a100 render's Hydra overrides (the seed-000
recipe, tests/render/a100-verl-single, checked against the renderer by tests/unit/render/test_render_output.py)
composed by verl 0.9.1's own `main_ppo` entry point (`--cfg job`: Hydra composes and prints the job's config, nothing
runs) inside the verl-cpu image, as the run user. A key verl does not have, a value of the wrong type or a group that
does not exist makes Hydra refuse; the test also reads the composed values back. Seconds once the image exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from grpo_deploy.runtime.verl.node import read_overrides

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ROOT / "tests" / "render" / "a100-verl-single" / "expected" / "config" / "verl-overrides.txt"


def compose(client, image: str, overrides: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `main_ppo --cfg job` with *overrides*, in a container of *image*."""
    container = client.containers.run(image, ["python3", "-m", "verl.trainer.main_ppo", "--cfg", "job", *overrides],
                                      detach=True)
    try:
        code = container.wait(timeout=600)["StatusCode"]
        return (code, container.logs(stdout=True, stderr=False).decode(errors="replace"),
                container.logs(stdout=False, stderr=True).decode(errors="replace"))
    finally:
        container.remove(force=True)


def composed(stdout: str) -> dict:
    """The config Hydra printed: the YAML from its first top-level key on (an import may print a line before)."""
    lines = stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if re.match(r"^[a-z_]+:", line))
    return yaml.safe_load("\n".join(lines[first:]))


def test_the_a100_overrides_compose_against_verls_real_config(verl_image, docker_client):
    overrides = read_overrides(OVERRIDES)
    assert len(overrides) >= 40
    code, out, err = compose(docker_client, verl_image, overrides)
    assert code == 0, out[-2000:] + err[-3000:]
    config = composed(out)
    wanted = dict(line.split("=", 1) for line in overrides)
    assert str(config["actor_rollout_ref"]["model"]["path"]) == wanted["actor_rollout_ref.model.path"]
    assert config["actor_rollout_ref"]["model"]["lora_rank"] == int(wanted["actor_rollout_ref.model.lora_rank"])
    assert config["trainer"]["save_freq"] == int(wanted["trainer.save_freq"])
    assert config["trainer"]["resume_mode"] == "auto"
    assert config["data"]["train_files"] == wanted["data.train_files"]


def test_a_key_verl_does_not_have_is_refused(verl_image, docker_client):
    """The check can fail: one misspelt key (Hydra: not in the struct config) and the composition stops."""
    code, out, err = compose(docker_client, verl_image, ["trainer.save_frequency=20"])
    assert code != 0 and "save_frequency" in err, out[-2000:] + err[-3000:]
