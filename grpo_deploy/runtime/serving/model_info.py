"""Warms vLLM's model-class facts cache at image build, so a server start does not pay for it.

Each vLLM start asks its model registry what the served architecture supports (LoRA, pipeline parallelism, ...). The
answer comes from a subprocess that imports vLLM and the model class again — about 9 s of a 32 s CPU start here —
unless `$VLLM_CACHE_ROOT/modelinfos/` holds it, keyed by a hash of the model class's source file (so an answer
written at build by the image's own vLLM is exactly what a start would compute). The images run this as their last
step for the architectures of the model they carry; Docker copies the image's cache folder into the run's fresh cache
volume on first use, and vLLM writes the same file itself where the image did not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpo_deploy.common.readback import MiB, ReadRefused, read_text


def architectures(model_dir: Path) -> list[str]:
    """The architectures a Hugging Face model folder names in its config.json."""
    config = json.loads(read_text(model_dir / "config.json", MiB, "the model's config.json"))
    names = config.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(n, str) and n.isidentifier() for n in names) or not names:
        raise ValueError(f"{model_dir / 'config.json'}: 'architectures' must be a non-empty list of class names")
    return names


def warm(names: list[str]) -> list[str]:
    """Ask vLLM's registry about each architecture (it writes the cache file); the names it did not know."""
    from vllm.model_executor.models.registry import ModelRegistry

    unknown = []
    for name in names:
        if name not in ModelRegistry.get_supported_archs() or ModelRegistry._try_inspect_model_cls(name) is None:
            unknown.append(name)
    return unknown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m grpo_deploy.runtime.serving.model_info",
        description="Write vLLM's model-class facts cache for a model folder's architectures (an image build step).")
    parser.add_argument("--model", required=True, type=Path, help="a Hugging Face model folder (its config.json)")
    args = parser.parse_args(argv)
    try:
        names = architectures(args.model)
    except (ReadRefused, ValueError) as e:  # JSONDecodeError is a ValueError
        print(f"model_info: {e}".splitlines()[0], file=sys.stderr)
        return 2
    unknown = warm(names)
    if unknown:
        print(f"model_info: vLLM does not know {', '.join(unknown)}", file=sys.stderr)
        return 1
    print(f"model_info: cached vLLM's facts for {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
