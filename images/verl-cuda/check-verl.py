#!/usr/bin/env python3
"""In-image check of the air-gapped verl image (recipe cuda-verl-amd64), run without a GPU.

Usage: `grpo-deploy images verify cuda-verl-amd64` runs this file from the kit with the image's own labels as
EXPECT_* environment values; by hand, in the image:
  docker run --rm IMAGE python3 /opt/grpo-deploy/bin/check-verl.py --uid 1000 --gid 1000 --cuda 13.0 \
      --vllm 0.31.0 --verl 0.9.1

The checks the CUDA server and trainer images share come from their checker (/opt/grpo-deploy/bin/check-image.py in
the image: run user and HOME, caches writable, `python3` and `python`, tini and the entrypoint, torch's CUDA build);
then verl's own: vLLM and verl at their labels' versions, TransferQueue, Ray and Hydra import, no TRL (verl 0.9.1
breaks beside TRL 1.x), the kit's verl plugin found by verl's entry-point scan and leaving the platform to verl, the
`ray` CLI, the modules compose.verl.yaml starts (`python3 -m grpo_deploy.runtime.verl.node --help` and
`... runtime.health --help`), and the a100 profile's rendered overrides composed by verl's own `main_ppo --cfg job`
(nothing runs). One line per check;
exit 1 when any fails, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

BASE_CHECKER = "/opt/grpo-deploy/bin/check-image.py"
ENTRY_MODULES = ("grpo_deploy.runtime.verl.node", "grpo_deploy.runtime.health")  # what compose.verl.yaml starts
PROFILE = "a100"  # whose rendered overrides are composed


def base_checker():
    spec = importlib.util.spec_from_file_location("check_image", BASE_CHECKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_packages(r, base, vllm: str, verl: str) -> None:
    r.check("vllm", base.version("vllm") == vllm, f"distribution vllm {base.version('vllm')}, label says {vllm}")
    r.check("verl", base.version("verl") == verl, f"distribution verl {base.version('verl')}, label says {verl}")
    r.check("no-trl", base.version("trl") is None, f"distribution trl {base.version('trl')}")
    for module in ("vllm", "verl", "transfer_queue", "ray", "hydra", "peft", "yaml"):
        try:
            importlib.import_module(module)
            r.check("import", True, module)
        except Exception as error:  # noqa: BLE001 - any import failure is the finding
            r.check("import", False, f"{module}: {type(error).__name__}: {error}")


def check_plugin(r) -> None:
    try:
        from verl.plugin.platform.platform_manager import PlatformRegistry

        from grpo_deploy.runtime.verl import cpu as verl_cpu

        r.check("verl-plugin", PlatformRegistry.get(verl_cpu.PLATFORM) is not None and not verl_cpu.in_use(),
                f"the kit's platform registered by verl's plugin scan, in use: {verl_cpu.in_use()} "
                f"(VERL_PLATFORM={os.environ.get('VERL_PLATFORM')!r})")
    except Exception as error:  # noqa: BLE001
        r.check("verl-plugin", False, f"{type(error).__name__}: {error}")
    ray = shutil.which("ray")
    r.check("ray-cli", bool(ray), ray or "no `ray` on PATH")


def check_entry_modules(r) -> None:
    for module in ENTRY_MODULES:
        done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                              check=False, timeout=300)
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        r.check("entry", done.returncode == 0, f"python3 -m {module} --help" + ("" if done.returncode == 0
                                                                               else f" exit {done.returncode}: {tail}"))


def check_overrides(r) -> None:
    """The GPU profile's default spec rendered by the kit in the image and composed by verl's own entry point: Hydra
    refuses a key verl lacks or a value of the wrong type."""
    from grpo_deploy import render, spec
    from grpo_deploy.spec import new_spec, resolve

    res = resolve.resolve(spec.loads(new_spec.spec_text(PROFILE, "verl", ["node1"]), source="check.yaml"))
    text = render.render_files(res)["config/verl-overrides.txt"]
    overrides = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job", *overrides,
                               f"hydra.run.dir={folder}"], capture_output=True, text=True, check=False, timeout=600,
                              cwd=folder)
    tail = (done.stderr.strip().splitlines() or ["?"])[-1]
    r.check("verl-overrides", done.returncode == 0 and "actor_rollout_ref:" in done.stdout,
            f"{len(overrides)} overrides of the {PROFILE} render composed by main_ppo --cfg job"
            + ("" if done.returncode == 0 else f": exit {done.returncode}: {tail}"))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="check-verl.py", description=__doc__.splitlines()[0])
    for name, what in (("uid", "the run user's uid"), ("gid", "its gid"), ("cuda", "org.grpo-deploy.cuda-version"),
                       ("vllm", "org.grpo-deploy.vllm-version"), ("verl", "org.grpo-deploy.verl-version")):
        parser.add_argument(f"--{name}", default=os.environ.get(f"EXPECT_{name.upper()}") or None, help=what)
    options = parser.parse_args(argv)
    unset = [f"--{name}" for name, value in vars(options).items() if value is None]
    if unset:
        parser.error(f"{', '.join(unset)} not given and not in the environment (EXPECT_...)")
    for name in ("uid", "gid"):
        if not str(getattr(options, name)).isdigit():
            parser.error(f"--{name} {getattr(options, name)!r}: a number")
    return options


def main(argv: list[str]) -> int:
    options = parse(argv)
    base = base_checker()
    r = base.Report()
    r.check("role", os.environ.get("GRPO_ROLE") == "head", f"GRPO_ROLE={os.environ.get('GRPO_ROLE')!r}")
    base.check_user(r, int(options.uid), int(options.gid))
    base.check_caches(r)
    base.check_tools(r)
    base.check_torch(r, options.cuda)
    check_packages(r, base, options.vllm, options.verl)
    check_plugin(r)
    check_entry_modules(r)
    check_overrides(r)
    print(f"{'FAILED' if r.failed else 'passed'}: {r.failed} check(s) failed", flush=True)
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
