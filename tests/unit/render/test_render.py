"""Golden-file tests of grpo_deploy.render, one case per profile x engine, plus the acceptance facts per profile."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from grpo_deploy import render, spec
from grpo_deploy.settings import VLLM_KIT_FLAGS, VLLM_LORA_RANKS, vllm_flags
from grpo_deploy.spec import new_spec, profiles, resolve
from tests.render.regen import CASES, render_case

CASE_DIRS = sorted(p for p in CASES.iterdir() if (p / "spec.yaml").exists())


def test_every_profile_has_a_golden_case():
    profiles_covered = {p.name.split("-")[0] for p in CASE_DIRS}
    assert profiles_covered == set(profiles.names())


@pytest.mark.parametrize("case", CASE_DIRS, ids=lambda p: p.name)
def test_render_matches_golden(case: Path):
    files = render_case(case)
    expected_dir = case / "expected"
    expected = {p.relative_to(expected_dir).as_posix(): p.read_text() for p in expected_dir.rglob("*") if p.is_file()}
    assert sorted(files) == sorted(expected), "file set differs; regenerate with python -m tests.render.regen"
    for rel, text in files.items():
        assert text == expected[rel], f"{case.name}/{rel} differs from golden; regenerate and review the diff"


def _render(profile: str, engine: str, hosts=None, overrides: str | None = None) -> dict[str, str]:
    text = new_spec.spec_text(profile, engine, hosts or [])
    if overrides:
        text = text.replace("overrides: {}", f"overrides: {overrides}")
    return render.render_files(resolve.resolve(spec.loads(text)))


def _args(files: dict[str, str]) -> list[str]:
    return [ln for ln in files["config/server.args"].splitlines() if ln and not ln.startswith("#")]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_a100_verl_overrides_carry_seed_fixes():
    overrides = _render("a100", "verl", ["node1"])["config/verl-overrides.txt"]
    lines = overrides.splitlines()
    assert "trainer.max_actor_ckpt_to_keep=3" in lines
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=1" in lines
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.8" in lines
    assert "trainer.resume_mode=auto" in lines
    ckpt = next(ln.split("=", 1)[1] for ln in lines if ln.startswith("trainer.default_local_dir="))
    assert ckpt.startswith("/shared/")
    assert "save_total_limit" not in overrides
    # the rollout's own log-probs: verl logs their gap to the actor's, the served-policy check's input
    assert "actor_rollout_ref.rollout.calculate_log_probs=True" in lines


def test_a_users_override_turns_the_rollouts_log_probs_off():
    files = _render("a100", "verl", ["node1"],
                    overrides="{verl: {actor_rollout_ref.rollout.calculate_log_probs: false}}")
    lines = files["config/verl-overrides.txt"].splitlines()
    got = [ln for ln in lines if "calculate_log_probs" in ln]
    assert got == ["actor_rollout_ref.rollout.calculate_log_probs=False"], got


@pytest.mark.parametrize("profile,hosts", [("gb10", ["spark1", "spark2"]), ("h200", ["h200a"])])
def test_trl_server_flags_and_trainer_config(profile, hosts):
    files = _render(profile, "trl-async", hosts)
    args = _args(files)
    for flag in ("--enable-lora", "--logprobs-mode", "--max-lora-rank", "--max-loras", "--max-model-len"):
        assert flag in args
    assert "--api-key" not in args
    assert _flag(args, "--logprobs-mode") == "processed_logprobs"
    assert int(_flag(args, "--max-lora-rank")) in VLLM_LORA_RANKS
    assert int(_flag(args, "--max-loras")) == 4 + 2  # max_staleness 4
    assert int(_flag(args, "--max-model-len")) >= 1024 + 3000
    env = files["config/server.env"]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in env and "VLLM_SERVER_DEV_MODE=1" in env
    trainer = yaml.safe_load(files["config/trainer.yaml"])
    assert trainer["async_grpo"]["token_budget"] > 0, "packing on"
    assert trainer["async_grpo"]["gradient_checkpointing"] is False
    assert trainer["async_grpo"]["output_dir"].startswith("/shared/")


# A value for every VllmSettings flag field, none of them the gb10 pair's own (adding a field means adding it here).
VLLM_VALUES = {
    "port": 8123, "dtype": "float16", "max_lora_rank": 64, "max_loras": 9, "max_cpu_loras": 12, "max_model_len": 8192,
    "gpu_memory_utilization": 0.5, "max_num_seqs": 200, "enforce_eager": True, "enable_prefix_caching": False,
    "max_num_batched_tokens": 4096, "load_format": "safetensors", "kv_cache_dtype": "fp8",
}


def test_every_vllm_flag_field_renders_its_value():
    assert set(VLLM_VALUES) == set(vllm_flags()), "give every flag field a value here"
    args = _args(_render("gb10", "trl-async", ["spark1", "spark2"], f"{{vllm: {VLLM_VALUES}}}"))
    for name, flag in vllm_flags().items():
        lines = flag.args(VLLM_VALUES[name])
        assert lines and any(args[i:i + len(lines)] == lines for i in range(len(args))), (name, lines, args)
    assert _flag(args, "--kv-cache-dtype") == "fp8" and "--no-enable-prefix-caching" in args
    assert len(args) == len(set(a for a in args if a.startswith("-"))) + sum(not a.startswith("-") for a in args)


def test_null_vllm_settings_render_no_flag():
    args = _args(_render("gb10", "trl-async", ["spark1", "spark2"]))
    for flag in ("--kv-cache-dtype", "--load-format", "--max-num-batched-tokens", "--enforce-eager"):
        assert flag not in args
    assert not any(a.startswith("--no-") for a in args)


def test_kit_flags_render_before_the_field_they_name_then_extra_args_last():
    args = _args(_render("cpu", "trl-async", overrides="{vllm: {enforce_eager: true, extra_args: [--max-log-len=5]}}"))
    for kit in VLLM_KIT_FLAGS:
        assert args.index(kit.name) < args.index(vllm_flags()[kit.before].name), kit
    assert args[:2] == ["--model", "/opt/grpo-deploy/models/tiny-qwen2"] and args[-1] == "--max-log-len=5"
    assert _flag(args, "--seed") == "0" and _flag(args, "--host") == "0.0.0.0"

def test_max_loras_follows_staleness():
    args = _args(_render("gb10", "trl-async", ["spark1", "spark2"], "{trl: {max_staleness: 7}}"))
    assert _flag(args, "--max-loras") == "9"


def test_gb10_server_memory_fraction_is_0_6():
    assert _flag(_args(_render("gb10", "trl-async", ["spark1", "spark2"])), "--gpu-memory-utilization") == "0.6"


def test_no_secret_values_in_rendered_files(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-123456")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_abcdef")
    text = new_spec.spec_text("h200", "trl-async", ["h200a"]).replace("kind: none", "kind: wandb")
    files = render.render_files(resolve.resolve(spec.loads(text)))
    for rel, body in files.items():
        assert "wandb-secret-123456" not in body and "hf_secret_abcdef" not in body, rel


def test_cpu_trainer_config_turns_off_bf16_and_sets_cpu():
    trainer = yaml.safe_load(_render("cpu", "trl-async")["config/trainer.yaml"])
    assert trainer["device"] == "cpu"
    assert trainer["async_grpo"]["use_cpu"] is True and trainer["async_grpo"]["bf16"] is False
    assert trainer["adapters"]["keep"] == trainer["async_grpo"]["max_staleness"] + 2


def test_single_host_gpu_split_gives_each_role_its_own_gpu():
    gpu = yaml.safe_load(_render("h200", "trl-async", ["h200a"])["hosts/h200a.gpu.yaml"])
    ids = {role: svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
           for role, svc in gpu["services"].items()}
    assert ids == {"server": ["0"], "trainer": ["1"]}


def test_gb10_installs_the_attention_shim():
    trainer = yaml.safe_load(_render("gb10", "trl-async", ["spark1", "spark2"])["config/trainer.yaml"])
    assert trainer["attention_shim"] == "on"


def test_unquoted_on_in_yaml_is_caught():
    text = new_spec.spec_text("cpu", "trl-async").replace("overrides: {}", "overrides: {runtime: {attention_shim: on}}")
    with pytest.raises(spec.SpecError) as info:
        resolve.resolve(spec.loads(text))
    assert "overrides.runtime.attention_shim" in str(info.value) and "quote" in str(info.value)


def test_server_env_carries_vllm_env_and_nothing_else_does():
    files = _render("gb10", "trl-async", overrides="{vllm: {env: {VLLM_LOGGING_LEVEL: DEBUG, FLAG: true}}}")
    env_lines = files["config/server.env"].splitlines()
    assert "VLLM_LOGGING_LEVEL=DEBUG" in env_lines and "FLAG=1" in env_lines
    assert "VLLM_LOGGING_LEVEL" not in files["config/trainer.env"]


def test_verl_data_files_follow_dataset_path():
    """A JSONL dataset.path is the head's source for the parquet files on the share; a parquet one is verl's own."""
    base = new_spec.spec_text("a100", "verl", [])
    jsonl, parquet = "/shared/in/gsm8k.jsonl", "/shared/mine/train-v2.parquet"
    for path, train, source in ((jsonl, "/shared/data/gsm8k/train.parquet", jsonl), (parquet, parquet, "")):
        text = re.sub(r"(?m)^(dataset:.*\n  name: .*\n  path:) null", rf"\1 {path}", base)
        files = render.render_files(resolve.resolve(spec.loads(text)))
        assert f"data.train_files={train}" in files["config/verl-overrides.txt"].splitlines()
        assert json.loads(files["config/verl-node.json"])["data_source"] == source


@pytest.mark.parametrize("case", ["a100-verl-single", "cpu-verl-cluster"])
def test_a_verl_run_publishes_no_vllm_port(case):
    """verl's vLLM is colocated in its trainer (hybrid engine): no compose file a verl host uses publishes a port (the
    server's door needs no front there), and its Kubernetes bases have no Service and no containerPort."""
    from grpo_deploy.hosts.project import compose_files

    kit = compose_files()
    files = render_case(CASES / case)
    hosts = [text for rel, text in files.items() if rel.startswith("hosts/") and rel.endswith(".env")]
    assert hosts
    for env in hosts:
        used = env.split("COMPOSE_FILE=")[1].split("\n")[0].split(":")
        services = env.split("GRPO_SERVICES=")[1].split("\n")[0].split(",")
        for name in used:
            doc = yaml.safe_load(kit[name]) or {}
            for service in services:
                assert "ports" not in (doc.get("services") or {}).get(service, {}), (case, name, service)
        assert "GRPO_SERVER_PUBLISH" not in env and "GRPO_RUN_TOKEN_FILE" not in env
    root = Path(__file__).resolve().parents[3] / "k8s" / "base"
    for folder in ("verl", "verl-rayjob"):
        for path in (root / folder).glob("*.yaml"):
            for doc in yaml.safe_load_all(path.read_text()):
                assert doc.get("kind") != "Service" and "containerPort" not in json.dumps(doc), path
