"""Tiny rehearsal model: byte-identical builds, a vLLM-compatible shape, and a char-level ChatML tokenizer."""

import json
import os

import pytest

pytest.importorskip("transformers")

from transformers import AutoTokenizer  # noqa: E402

from grpo_deploy.runtime import tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    first = tiny_model.build(str(root / "a"), seed=0)
    second = tiny_model.build(str(root / "b"), seed=0)
    return root, first, second


def test_same_seed_same_bytes_other_seed_other_weights(built, tmp_path):
    root, first, second = built
    assert first == second
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(first)
    other = tiny_model.build(str(tmp_path / "c"), seed=1)
    assert other["model.safetensors"] != first["model.safetensors"]
    assert other["tokenizer.json"] == first["tokenizer.json"]


def test_architecture_fits_vllm_cpu(built):
    root = built[0] / "a"
    config = json.loads((root / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["head_dim"] == 64 and config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["hidden_size"] == config["head_dim"] * config["num_attention_heads"]
    generation = json.loads((root / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"]
    umask = os.umask(0)
    os.umask(umask)
    assert oct(os.stat(root / "model.safetensors").st_mode & 0o777) == oct(0o666 & ~umask)


def test_tokenizer_reloads_as_char_level_chatml(built):
    root = built[0] / "a"
    tokenizer = AutoTokenizer.from_pretrained(str(root))
    config = json.loads((root / "config.json").read_text())
    assert len(tokenizer) == config["vocab_size"] == 100
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == config["eos_token_id"]
    text = "Hi there!\n\tok"
    assert len(tokenizer(text, add_special_tokens=False).input_ids) == len(text)
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tokenizer(special, add_special_tokens=False).input_ids) == 1
    messages = [{"role": "user", "content": "Tell me about rain."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert tokenizer.decode(ids) == "<|im_start|>user\nTell me about rain.<|im_end|>\n<|im_start|>assistant\n"


def test_cli_writes_the_model(tmp_path, capsys):
    assert tiny_model.main(["--out", str(tmp_path / "m"), "--seed", "3"]) == 0
    assert "model.safetensors" in capsys.readouterr().out
