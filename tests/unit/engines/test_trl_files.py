"""Tests of grpo_deploy.engines.trl_files: vLLM's argument lines (each setting's flag, the kit's own flags, extra_args
last) and the trainer's config, validated by the runtime's own schema."""

from grpo_deploy import spec
from grpo_deploy.engines import TRL_ASYNC, trl_files
from grpo_deploy.spec import resolve
from tests.specs import spec_yaml


def _res(**changes):
    return resolve.resolve(spec.loads(spec_yaml("cpu", "trl-async", (), **changes), source="s.yaml"))


def test_server_args_carry_the_port_and_the_extra_args_last():
    res = _res(**{"overrides": {"vllm": {"extra_args": ["--enable-prompt-tokens-details"]}}})
    lines = trl_files.server_arg_lines(res)
    assert lines[-1] == "--enable-prompt-tokens-details"
    assert lines[lines.index("--port") + 1] == str(res.settings.vllm.port)


def test_trainer_config_on_cpu_uses_the_cpu_and_the_run_s_folders():
    res = _res()
    config = trl_files.trainer_config(TRL_ASYNC, res)
    assert config.run_name == res.spec.run.name and config.device == "cpu"
    grpo = config.async_grpo.model_dump()
    assert grpo["use_cpu"] is True and grpo["bf16"] is False
    assert grpo["output_dir"] == res.checkpoint_dir and grpo["report_to"] == "none"
    assert config.metrics_path == f"{res.run_dir}/metrics.jsonl"


def test_vllm_context_sorts_the_server_environment():
    res = _res(**{"overrides": {"vllm": {"env": {"B_VAR": "1", "A_VAR": "2"}}}})
    assert list(trl_files.vllm_context(res)["env"]) == sorted(trl_files.vllm_context(res)["env"])
