"""Builds the rehearsal model: a tiny random Qwen2 with a local char-level ChatML tokenizer, byte-identical per seed."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

from .identity import current_umask

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHARACTERS = ["\n", "\t"] + [chr(c) for c in range(32, 127)]  # one token each; other characters are dropped

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# head_dim 64: vLLM's CPU attention rejects 16. Two query heads share one KV head (grouped-query, like Qwen2.5).
ARCHITECTURE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
}


def build_tokenizer():
    """Char-level tokenizer in Qwen2's own byte-level format (what AutoTokenizer rebuilds for a qwen2 model).

    The vocabulary is the three ChatML specials plus one byte-level symbol per newline, tab and printable ASCII
    character, with no merges: every such character is one token.
    """
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_symbol = bytes_to_unicode()
    symbols = [byte_symbol[ord(c)] for c in CHARACTERS]
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + symbols)}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=ARCHITECTURE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_model(vocab_size: int, eos_token_id: int, pad_token_id: int, seed: int):
    """Qwen2ForCausalLM with seeded random fp32 weights, plus its generation config."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        bos_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        dtype="float32",
        **ARCHITECTURE,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=pad_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id, do_sample=True
    )
    return model


def build(out_dir: str, seed: int = 0) -> dict[str, str]:
    """Write tokenizer, config, generation config and safetensors weights to `out_dir`; returns file -> sha256."""
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _apply_umask_modes(out_dir)
    return digests(out_dir)


def _apply_umask_modes(out_dir: str) -> None:
    """Give every file the mode the umask implies: safetensors writes weights 0600 whatever the umask, and an image
    that builds the model as one user and serves it as another would otherwise fail to read it."""
    umask = current_umask()
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            os.chmod(path, 0o666 & ~umask)


def digests(out_dir: str) -> dict[str, str]:
    """sha256 of every file in a model directory, for determinism checks."""
    result = {}
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                result[name] = hashlib.sha256(handle.read()).hexdigest()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.tiny_model", description=__doc__)
    parser.add_argument("--out", required=True, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    files = build(args.out, args.seed)
    for name, digest in files.items():
        print(f"{digest}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
