"""Builds the local random-weight models: the rehearsal's tiny Qwen2 (byte-identical per seed) and, for the GPU
harness, seed 004's Qwen2.5-Math-1.5B architecture; both with a local char-level ChatML tokenizer (no hub access)."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

from grpo_deploy.runtime.bench.synthetic_rollouts import QWEN25_15B
from grpo_deploy.runtime.identity import current_umask

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


# Seed 004's recipe model for the GPU harness: Qwen2.5-Math-1.5B's architecture (written out once, in
# synthetic_rollouts), random weights in bf16 (3.1 GB on disk). Its vocabulary is Qwen's 151,936: the tokenizer is
# padded to that size with filler tokens, so every id a random model samples decodes to text (vLLM detokenizes them).
QWEN25_MATH_15B = {k: v for k, v in QWEN25_15B.items() if k != "vocab_size"} | {"initializer_range": 0.02}
SHAPES = {"tiny": (ARCHITECTURE, None, "float32"),
          "qwen2.5-1.5b": (QWEN25_MATH_15B, QWEN25_15B["vocab_size"], "bfloat16")}


def build_tokenizer(vocab_size: int | None = None, max_length: int = ARCHITECTURE["max_position_embeddings"]):
    """Char-level tokenizer in Qwen2's own byte-level format (what AutoTokenizer rebuilds for a qwen2 model).

    The vocabulary is the three ChatML specials plus one byte-level symbol per newline, tab and printable ASCII
    character, with no merges: every such character is one token. With *vocab_size*, filler tokens (`~x1f`, ...: ASCII
    text, never produced by encoding a prompt, since merges are empty) pad it to that many ids.
    """
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_symbol = bytes_to_unicode()
    symbols = [byte_symbol[ord(c)] for c in CHARACTERS]
    fillers = [f"~x{i:x}" for i in range(max(0, (vocab_size or 0) - len(SPECIAL_TOKENS) - len(symbols)))]
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + symbols + fillers)}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_model(vocab_size: int, eos_token_id: int, pad_token_id: int, seed: int, shape: str = "tiny"):
    """Qwen2ForCausalLM of *shape* with seeded random weights (fp32 for the tiny one, bf16 for the 1.5B), plus its
    generation config."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    architecture, _, dtype = SHAPES[shape]
    config = Qwen2Config(
        vocab_size=vocab_size,
        bos_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        dtype=dtype,
        **architecture,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=pad_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id, do_sample=True
    )
    return model


def build(out_dir: str, seed: int = 0, shape: str = "tiny") -> dict[str, str]:
    """Write tokenizer, config, generation config and safetensors weights to `out_dir`; returns file -> sha256."""
    architecture, vocab_size, _ = SHAPES[shape]
    tokenizer = build_tokenizer(vocab_size, architecture["max_position_embeddings"])
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed, shape)
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
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny",
                        help="tiny: the rehearsal's model (default); qwen2.5-1.5b: seed 004's architecture, bf16, "
                             "random weights (3.1 GB, for the GPU harness)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    files = build(args.out, args.seed, args.shape)
    for name, digest in files.items():
        print(f"{digest}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
