"""Shared-volume permission probe: `probe write` as the trainer identity, `probe read` as the server identity."""

from __future__ import annotations

import argparse
import json
import os
import sys

from grpo_deploy.runtime.identity import apply_umask, identity
from grpo_deploy.runtime.storage.adapters import WEIGHTS_FILE, fsync_tree, mode_of

PROBE_PREFIX = "probe-"
CONFIG_FILE = "adapter_config.json"


def write_probe(directory: str) -> dict:
    """Write `<dir>/probe-<uid>/` the way the trainer writes an adapter: safetensors weights and a JSON config.

    The numpy front end of safetensors calls the same writer (`serialize_file`) as `safetensors.torch.save_file`,
    which PEFT uses, so the file mode is the trainer's (0600 in safetensors 0.8.0) without a 2.5 s torch import.
    """
    import numpy
    from safetensors.numpy import save_file

    target = os.path.join(directory, f"{PROBE_PREFIX}{os.getuid()}")
    os.makedirs(target, exist_ok=True)
    weights = os.path.join(target, WEIGHTS_FILE)
    save_file({"base_model.model.probe.lora_A.weight": numpy.zeros((1, 4), dtype=numpy.float32)}, weights)
    with open(os.path.join(target, CONFIG_FILE), "w", encoding="utf-8") as handle:
        json.dump({"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["probe"]}, handle)
    fsync_tree(target)
    return {
        **identity(),
        "ok": True,
        "path": weights,
        "file_mode": mode_of(weights),
        "config_mode": mode_of(os.path.join(target, CONFIG_FILE)),
        "dir_mode": mode_of(target),
    }


def probe_files(directory: str) -> list[str]:
    files = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(PROBE_PREFIX) and os.path.isdir(path):
            files += [os.path.join(path, f) for f in (WEIGHTS_FILE, CONFIG_FILE)]
    return files


def read_probes(directory: str) -> dict:
    """Open every probe file in `directory` as this process's identity; the weights are parsed as safetensors too."""
    errors = []
    try:
        files = probe_files(directory)
    except OSError as error:
        files, errors = [], [{"path": directory, "error": f"{type(error).__name__}: {error}"}]
    if not files and not errors:
        errors.append({"path": directory, "error": "no probe files (run `probe write` first)"})
    for path in files:
        try:
            # A plain open first: safetensors 0.8.0 reports EACCES as "FileNotFoundError: No such file or
            # directory", the same misreport that reaches the trainer as a 404 from the server.
            with open(path, "rb") as handle:
                content = handle.read()
            if path.endswith(".safetensors"):
                from safetensors import safe_open

                with safe_open(path, framework="numpy") as reader:  # same reader as "pt", no torch import
                    for key in reader.keys():
                        reader.get_tensor(key)
            else:
                json.loads(content)
        except Exception as error:  # PermissionError is the case this exists for; report any failure the same way
            errors.append({"path": path, "error": f"{type(error).__name__}: {error}"})
    return {"uid": os.getuid(), "gid": os.getgid(), "ok": not errors, "files": len(files), "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.storage.share_probe", description=__doc__)
    parser.add_argument("action", choices=("write", "read"))
    parser.add_argument("--dir", required=True, help="directory on the shared volume")
    args = parser.parse_args(argv)
    if args.action == "write":
        apply_umask()
        try:
            result = write_probe(args.dir)
        except OSError as error:
            print(json.dumps({**identity(), "ok": False, "error": f"{type(error).__name__}: {error}"}))
            return 1
        print(json.dumps(result))
        return 0
    result = read_probes(args.dir)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
