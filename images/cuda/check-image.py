#!/usr/bin/env python3
"""In-image check of the air-gapped CUDA images, run without a GPU: what can be verified inside the built image.

Usage: `grpo-deploy images verify cuda-server-amd64` runs this file from the kit with the image's own labels as
EXPECT_* environment values; by hand, in the image (the build keeps a copy) or with flags:
  docker run --rm IMAGE python3 /opt/grpo-deploy/bin/check-image.py \
      --role server|trainer --uid 1000 --gid 1000 --cuda 13.0 --vllm 0.31.0 [--trl 1.16.0]

One line per check: `ok`, `FAIL`, or `n/a` for what cannot run without a GPU (said plainly, never counted as a
pass); exit 1 when any check fails, 2 for bad arguments. Checks: run user and HOME, caches writable, `python3` and
`python`, tini and the entrypoint, torch's CUDA build, the ptxas TRITON_PTXAS_PATH names (arm64), vllm and its
OpenAI server module, trl and peft, TRL's vLLM version gate, the modules compose and k8s start (`python3 -m
grpo_deploy.runtime.serving.serve`, `...trainer.train`, `...health`), and `vllm serve --help` (which needs a GPU to
build its defaults: reported as n/a when it says so).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import warnings

# The modules compose/compose.yaml and k8s/base/trl-async start or probe with `python3 -m`.
ENTRY_MODULES = ("grpo_deploy.runtime.serving.serve", "grpo_deploy.runtime.trainer.train", "grpo_deploy.runtime.health")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # what grpo_deploy.runtime.serving.serve execs
NO_GPU_MARK = "Failed to infer device type"  # vLLM's CLI without any accelerator
CACHES = ("~/.cache/huggingface", "~/.cache/vllm", "~/.triton", "$TRITON_CACHE_DIR", "$TORCHINDUCTOR_CACHE_DIR")


class Report:
    def __init__(self) -> None:
        self.failed = 0

    def line(self, verdict: str, name: str, detail: str) -> None:
        self.failed += verdict == "FAIL"
        print(f"{verdict:<4} {name}: {detail}", flush=True)

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.line("ok" if ok else "FAIL", name, detail)
        return ok


def check_user(r: Report, uid: int, gid: int) -> None:
    now = (os.getuid(), os.getgid())
    r.check("user", now == (uid, gid), f"runs as {now[0]}:{now[1]}, expected {uid}:{gid}")
    try:
        entry = pwd.getpwuid(now[0])
    except KeyError:
        r.check("passwd", False, f"no passwd entry for uid {now[0]} (PyTorch's getpass() crashes)")
        return
    home = os.environ.get("HOME", "")
    r.check("home", home == entry.pw_dir and os.access(home, os.W_OK),
            f"HOME={home!r}, passwd home {entry.pw_dir!r} ({entry.pw_name}), "
            f"{'writable' if os.access(home, os.W_OK) else 'NOT writable'}")


def check_caches(r: Report) -> None:
    for raw in CACHES:
        path = os.path.expandvars(os.path.expanduser(raw))
        if "$" in path:
            r.check("cache", False, f"{raw} is not set")
            continue
        try:
            with tempfile.NamedTemporaryFile(dir=path):
                pass
            owner = os.stat(path).st_uid
            r.check("cache", owner == os.getuid(), f"{path} writable, owner uid {owner}")
        except OSError as error:
            r.check("cache", False, f"{path}: {error.strerror or error}")


def check_tools(r: Report) -> None:
    for name in ("python3", "python"):
        found = shutil.which(name)
        out = subprocess.run([found, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True, check=False).stdout.strip() if found else ""
        r.check(name, bool(found) and out.startswith("3.11"), f"{found or 'not on PATH'} (Python {out or '?'})")
    for path in ("/usr/bin/tini", "/opt/grpo-deploy/bin/entrypoint.sh"):
        usable = os.access(path, os.X_OK)
        r.check("entrypoint", usable, f"{path} {'executable' if usable else 'missing or not executable'}")


def check_ptxas(r: Report, cuda: str) -> None:
    """Where TRITON_PTXAS_PATH is set (the arm64 image: GB10's sm_121a), it must be a ptxas of the image's CUDA."""
    path = os.environ.get("TRITON_PTXAS_PATH")
    if not path:
        return
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, check=False, timeout=120)
        out = done.stdout
    except OSError as error:
        r.check("ptxas", False, f"TRITON_PTXAS_PATH={path}: {error.strerror or error}")
        return
    # CUDA's minor version compatibility: a ptxas of the same major (the nvcc wheel is newer than torch's 13.0).
    major = f"release {cuda.split('.')[0]}."
    line = next((ln for ln in out.splitlines() if "release" in ln), "no release line")
    r.check("ptxas", done.returncode == 0 and major in out,
            f"TRITON_PTXAS_PATH={path}: {line.strip()}, expected CUDA {cuda.split('.')[0]}.x")


def check_torch(r: Report, cuda: str) -> None:
    try:
        import torch
    except Exception as error:  # noqa: BLE001 - any import failure is the finding
        r.check("torch-cuda", False, f"import torch: {error}")
        return
    built = torch.version.cuda
    r.check("torch-cuda", built == cuda, f"torch {torch.__version__} built with CUDA {built}, label says {cuda}")
    r.line("n/a", "gpu", f"torch.cuda.is_available() = {torch.cuda.is_available()}: no GPU here, kernels not run")


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_packages(r: Report, vllm: str, trl: str | None) -> None:
    found = version("vllm")
    r.check("vllm", found == vllm, f"distribution vllm {found}, label says {vllm}")
    for module in ("vllm", SERVER_MODULE, "trl", "peft", "yaml"):
        try:
            importlib.import_module(module)
            r.check("import", True, module)
        except Exception as error:  # noqa: BLE001
            r.check("import", False, f"{module}: {type(error).__name__}: {error}")
    if trl:
        r.check("trl", version("trl") == trl, f"distribution trl {version('trl')}, label says {trl}")


def check_trl_gate(r: Report) -> None:
    """TRL 1.16's own gate (trl.import_utils.is_vllm_available): it warns outside 0.22.0-0.31.0, and its client picks
    the stateful weight-sync API only when it reports vLLM >= 0.28.0."""
    try:
        from trl.import_utils import is_vllm_available
    except Exception as error:  # noqa: BLE001
        r.check("trl-gate", False, f"trl.import_utils.is_vllm_available: {error}")
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available, new_api = is_vllm_available(), is_vllm_available(min_version="0.28.0")
    complaints = [str(w.message) for w in caught if "vLLM" in str(w.message)]
    r.check("trl-gate", available and new_api and not complaints,
            f"is_vllm_available()={available}, min 0.28.0={new_api}"
            + (f", warns: {complaints[0]}" if complaints else ", no version warning"))


def check_entry_modules(r: Report) -> None:
    for module in ENTRY_MODULES:
        done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                              check=False, timeout=300)
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        r.check("entry", done.returncode == 0, f"python3 -m {module} --help" + ("" if done.returncode == 0
                                                                               else f" exit {done.returncode}: {tail}"))


def check_vllm_cli(r: Report) -> None:
    exe = shutil.which("vllm")
    if not exe:
        r.check("vllm-cli", False, "no `vllm` on PATH")
        return
    done = subprocess.run([exe, "serve", "--help"], capture_output=True, text=True, check=False, timeout=300)
    if done.returncode == 0:
        r.check("vllm-cli", True, "vllm serve --help")
    elif NO_GPU_MARK in done.stdout + done.stderr:
        r.line("n/a", "vllm-cli", f"vllm serve --help needs a GPU to build its defaults ({NO_GPU_MARK}): "
                                  "not checkable here; the server module imports (see above)")
    else:
        tail = ((done.stderr or done.stdout).strip().splitlines() or ["?"])[-1]
        r.check("vllm-cli", False, f"vllm serve --help exit {done.returncode}: {tail}")


def parse(argv: list[str]) -> argparse.Namespace:
    """Each expectation from its flag, else from the environment `grpo-deploy images verify` sets from the image's
    labels (EXPECT_ROLE, EXPECT_UID, EXPECT_GID, EXPECT_CUDA, EXPECT_VLLM, EXPECT_TRL)."""
    parser = argparse.ArgumentParser(prog="check-image.py", description=__doc__.splitlines()[0])

    def env(name: str) -> str | None:
        return os.environ.get(f"EXPECT_{name.upper()}") or None

    parser.add_argument("--role", choices=("server", "trainer"), default=env("role"))
    parser.add_argument("--uid", type=int, default=env("uid"))
    parser.add_argument("--gid", type=int, default=env("gid"))
    parser.add_argument("--cuda", default=env("cuda"), help="major.minor, the image's org.grpo-deploy.cuda-version")
    parser.add_argument("--vllm", default=env("vllm"), help="the image's org.grpo-deploy.vllm-version")
    parser.add_argument("--trl", default=env("trl"), help="the image's org.grpo-deploy.trl-version")
    options = parser.parse_args(argv)
    unset = [f"--{name}" for name in ("role", "uid", "gid", "cuda", "vllm") if getattr(options, name) is None]
    if unset:
        parser.error(f"{', '.join(unset)} not given and not in the environment (EXPECT_...)")
    return options


def main(argv: list[str]) -> int:
    options = parse(argv)
    r = Report()
    r.check("role", os.environ.get("GRPO_ROLE") == options.role, f"GRPO_ROLE={os.environ.get('GRPO_ROLE')!r}")
    check_user(r, options.uid, options.gid)
    check_caches(r)
    check_tools(r)
    check_torch(r, options.cuda)
    check_ptxas(r, options.cuda)
    check_packages(r, options.vllm, options.trl)
    check_trl_gate(r)
    check_entry_modules(r)
    check_vllm_cli(r)
    print(f"{'FAILED' if r.failed else 'passed'}: {r.failed} check(s) failed", flush=True)
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
