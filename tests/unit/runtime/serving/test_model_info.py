"""model_info: the architectures read from a model folder's config.json, bounded; bad folders answered in one line.
(The warming itself needs vLLM: the cpu image's build runs it, and its start-up figure is in docs/MEASUREMENTS.md.)"""

from __future__ import annotations

import json
import os

import pytest

from grpo_deploy.runtime.serving import model_info


def _model(tmp_path, config) -> object:
    (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return tmp_path


def test_architectures_come_from_the_config(tmp_path):
    assert model_info.architectures(_model(tmp_path, {"architectures": ["Qwen2ForCausalLM"]})) == ["Qwen2ForCausalLM"]


@pytest.mark.parametrize("config", [
    {}, {"architectures": []}, {"architectures": "Qwen2ForCausalLM"}, {"architectures": ["a.b"]},
    {"architectures": ["x\n"]}, "not json",
])
def test_a_config_without_class_names_is_refused_in_one_line(tmp_path, capsys, config):
    assert model_info.main(["--model", str(_model(tmp_path, config))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("model_info: ") and err.count("\n") == 1


def test_a_linked_or_huge_config_is_not_read(tmp_path, capsys):
    (tmp_path / "elsewhere.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "config.json")
    assert model_info.main(["--model", str(tmp_path)]) == 2
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(" " * (model_info.MiB + 1))
    assert model_info.main(["--model", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err
