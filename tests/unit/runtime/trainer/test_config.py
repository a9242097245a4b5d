"""Trainer config: validation messages, device handling and the builders; every rendered trainer.yaml (the golden
renders) parses in this schema, and the rehearsal's builds a real AsyncGRPOConfig."""

import copy
from pathlib import Path

import pytest
import yaml

from grpo_deploy.runtime.trainer.config import (
    CHATML_RESPONSE_TEMPLATE,
    ConfigError,
    build_grpo_kwargs,
    build_lora_config,
    load_config,
    parse_config,
    response_template,
)

GOLDEN = Path(__file__).resolve().parents[3] / "render"
# The rehearsal's trainer config as the renderer writes it (tests/render: checked against the renderer).
EXAMPLE = str(GOLDEN / "cpu-trl-async-local" / "expected" / "config" / "trainer.yaml")

MINIMAL = {
    "run_name": "r",
    "model": "/models/tiny",
    "metrics_path": "/runs/r/metrics.jsonl",
    "async_grpo": {"output_dir": "/runs/r/output", "max_staleness": 2, "max_completion_length": 24},
}


def with_changes(**changes):
    raw = copy.deepcopy(MINIMAL)
    raw.update(changes)
    return raw


def test_defaults_for_a_minimal_config():
    config = parse_config(MINIMAL)
    assert config.dataset.name == "brevity" and config.dataset.num_prompts == 64
    assert config.rewards == ["brevity"] and config.device == "cpu" and config.resume == "auto"
    assert config.lora_dir == "/runs/r/output/.vllm_lora" and config.max_staleness == 2
    assert config.server_url == "http://localhost:8000"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"colour": "red"}, "colour: unknown key"),
        ({"model": None}, "model: must be set"),
        ({"async_grpo": {"learning_rate": 1}}, "async_grpo.output_dir: is required"),
        ({"dataset": {"name": "imagenet"}}, "dataset.name: 'imagenet' is not one of"),
        ({"dataset": {"name": "gsm8k"}}, "dataset.path: is required for dataset gsm8k"),
        ({"dataset": {"name": "brevity", "size": 3}}, "dataset.size: unknown key"),
        ({"rewards": ["brevity", "speed"]}, "rewards.1: 'speed' is not a registered reward"),
        ({"attention_shim": "sometimes"}, "attention_shim: 'sometimes' is not one of 'auto', 'on' or 'off'"),
        ({"device": "tpu"}, "device: 'tpu' is not one of 'cpu' or 'cuda'"),
        ({"resume": "checkpoint-3"}, "resume: must be auto, never or an absolute checkpoint path"),
        ({"lora": {"rank": 8}}, "lora.rank: unknown key"),
        ({"seed": "zero"}, "seed: input should be a valid integer, got 'zero'"),
        ({"lora": {"r": "on"}}, "lora.r: input should be a valid integer"),
        ({"lora": {"r": True}}, "lora.r: got the boolean True"),
        ({"async_grpo": {"output_dir": "/o", "learning_rate": float("inf")}}, "async_grpo.learning_rate"),
        ({"async_grpo": {"output_dir": "/o", "max_stepz": 3}}, "did you mean 'max_steps'"),
        ({"metrics_path": "/x/../etc/m"}, "metrics_path: '/x/../etc/m' is not a normalised path"),
    ],
)
def test_errors_name_the_key(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(with_changes(**changes), source="spec.yaml")


def test_yaml_booleans_are_not_shim_modes():
    """An unquoted on/off reaches the config as a boolean: refused, not guessed."""
    with pytest.raises(ConfigError, match="attention_shim: True is not one of"):
        parse_config(with_changes(attention_shim=True))


def test_cpu_forces_fp32_and_use_cpu():
    kwargs = build_grpo_kwargs(parse_config(MINIMAL))
    assert kwargs["use_cpu"] is True and kwargs["bf16"] is False and kwargs["fp16"] is False
    assert kwargs["run_name"] == "r" and kwargs["seed"] == 0 and kwargs["output_dir"] == "/runs/r/output"
    grpo = dict(MINIMAL["async_grpo"], bf16=True)
    with pytest.raises(ConfigError, match="async_grpo.bf16"):
        build_grpo_kwargs(parse_config(with_changes(async_grpo=grpo)))


def test_cuda_leaves_precision_to_the_config():
    kwargs = build_grpo_kwargs(parse_config(with_changes(device="cuda")))
    assert "use_cpu" not in kwargs and "bf16" not in kwargs


def test_lora_and_response_template():
    lora = build_lora_config(parse_config(with_changes(lora={"r": 4, "alpha": 8, "target_modules": ["q_proj"]})))
    assert (lora.r, lora.lora_alpha, set(lora.target_modules)) == (4, 8, {"q_proj"})
    assert response_template("chatml") is CHATML_RESPONSE_TEMPLATE and response_template(None) is None


def test_load_config_reports_missing_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(str(tmp_path / "absent.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))


def test_example_config_builds_a_real_async_grpo_config():
    trl = pytest.importorskip("trl.experimental.async_grpo")
    config = load_config(EXAMPLE)
    assert config.adapters.keep == config.max_staleness + 2
    args = trl.AsyncGRPOConfig(**build_grpo_kwargs(config))
    assert args.use_cpu and not args.bf16 and args.max_staleness == 2
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 16


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*/expected/config/trainer.yaml")), ids=lambda p: p.parts[-4])
def test_every_rendered_trainer_config_parses_in_the_container_schema(path):
    """The renderer writes what the container reads: a key drift between them fails here."""
    with open(path) as handle:
        raw = yaml.safe_load(handle)
    config = load_config(str(path))
    assert config.model_dump(exclude_unset=True, mode="json").keys() == raw.keys() - {"source"}
    assert config.async_grpo.model_dump(exclude_unset=True, mode="json") == raw["async_grpo"]


CUDA_BF16 = {"device": "cuda", "async_grpo": {"output_dir": "/runs/r/output", "bf16": True}}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({**CUDA_BF16, "speed": {"lora_elementwise": True}}, "speed: lora_elementwise needs compile_layers"),
        ({"speed": {"base_dtype": "bf16"}}, "speed.base_dtype: bf16 needs async_grpo.bf16"),
        ({"speed": {"fused_kernels": "liger"}}, "speed.fused_kernels: Liger's kernels need device: cuda"),
        ({"speed": {"base_dtype": "fp16"}}, "speed.base_dtype: 'fp16' is not one of"),
        ({"speed": {"compile": True}}, "speed.compile: unknown key"),
    ],
)
def test_speed_switches_are_checked_where_they_cannot_run(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(with_changes(**changes), source="trainer.yaml")


def test_speed_switches_default_to_todays_path_and_the_h200_render_turns_them_on():
    assert parse_config(MINIMAL).speed.model_dump() == {"base_dtype": "fp32", "fused_kernels": "off",
                                                        "compile_layers": False, "lora_elementwise": False}
    h200 = load_config(str(GOLDEN / "h200-trl-async-single" / "expected" / "config" / "trainer.yaml"))
    assert h200.speed.model_dump() == {"base_dtype": "bf16", "fused_kernels": "off", "compile_layers": True,
                                       "lora_elementwise": True}
    assert "speed" not in yaml.safe_load(Path(EXAMPLE).read_text()), "the cpu rehearsal keeps today's path"


@pytest.mark.parametrize("value", [0, -1, 17, "2", True, 2.5, 10**30, None, [2]])
def test_machines_outside_1_to_16_or_not_an_integer_are_refused_by_key(value):
    with pytest.raises(ConfigError, match=r"^spec.yaml: machines: "):
        parse_config(with_changes(machines=value), source="spec.yaml")


def test_the_world_is_the_processes_on_each_machine():
    config = parse_config(with_changes(processes=2, machines=3))
    assert (config.processes, config.machines, config.world_size) == (2, 3, 6)
    assert parse_config(MINIMAL).world_size == 1
