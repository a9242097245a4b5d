#!/usr/bin/env python3
"""Temporary driver of the air-gapped x86_64 CUDA images: lock, wheelhouse, deps image, role images, in-image check.

A stand-in until grpo_deploy/image_build/ takes these images into its recipe table (images/cuda/README.md lists the
inputs it needs). Plain `pip` and `docker` commands; one progress line per phase, everything else in the log file
whose path is printed; on failure the last lines of that log.

  python3 images/cuda/build.py [--uid 1000] [--gid 1000] [--skip-verify]   wheelhouse (when incomplete), images, check
  python3 images/cuda/build.py lock                                        resolve requirements-amd64.lock again

No registry: the wheels come from build/wheelhouse/cuda-amd64 (downloaded with `pip download --isolated` and this
host's CA bundle, which ignores the host's pip configuration, e.g. a find-links folder of CPU torch builds), served on
127.0.0.1 only while the dependency image builds (`docker build --network host`), so no layer holds a wheel.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "images" / "cuda"
sys.path.insert(0, str(ROOT))

from grpo_deploy import __version__, image_tags  # noqa: E402

ARCH = "amd64"
LOCK = HERE / f"requirements-{ARCH}.lock"
WHEELHOUSE = ROOT / "build" / "wheelhouse" / f"cuda-{ARCH}"
STAGING = ROOT / "build" / "cuda-context"
LOG = ROOT / "build" / "logs" / "cuda-images.log"
BASE_IMAGE = "grpo-deploy/debian:bookworm"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# What the lock resolves: the server image's vLLM pin (images/vllm/Dockerfile) and the trainer's pins
# (images/trainer/Dockerfile).
TOP_LEVEL = ("vllm==0.31.0", "trl==1.16.0", "peft==0.21.2", "kernels==0.17.2")
CUDA = image_tags.GPU_IMAGES["vllm"].cuda
# linux x86_64 wheels that run on bookworm (glibc 2.36) with CPython 3.11: pip expands no manylinux range by itself.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
PIP_TARGET = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
              *[arg for platform in PLATFORMS for arg in ("--platform", platform)]]
ROLES = {"server": image_tags.arch_tag("vllm", ARCH), "trainer": image_tags.arch_tag("trainer", ARCH)}
STAMP = ".complete"


class BuildError(Exception):
    """A step failed: the message is one line; the details are in the log."""


# ---- the log and the quiet runner

class Log:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.handle = path.open("a", encoding="utf-8")
        self.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} build.py {' '.join(sys.argv[1:])}")

    def write(self, text: str) -> None:
        self.handle.write(text.rstrip("\n") + "\n")
        self.handle.flush()

    def run(self, argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
        """Run argv with its output streamed into the log; BuildError naming `what` when it fails."""
        self.write("$ " + " ".join(argv))
        proc = subprocess.run(argv, stdout=self.handle, stderr=subprocess.STDOUT, env=env, check=False)
        if proc.returncode != 0:
            raise BuildError(f"{what} failed (exit {proc.returncode})")

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def phase(name: str, started: float, detail: str) -> None:
    print(f"[cuda-images] {name:<11} {time.monotonic() - started:7.1f} s  {detail}", flush=True)


# ---- lock

def pip_isolated_env() -> dict[str, str]:
    """pip's own environment variables (PIP_*) dropped: --isolated ignores config files, not all of these."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}


def resolve_lock(log: Log) -> int:
    """Resolve TOP_LEVEL for the target platform (no download: pip's install report) and write LOCK, hash-pinned."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        log.run([sys.executable, "-m", "pip", "install", "--isolated", "--cert", CA_BUNDLE, "--dry-run",
                 "--ignore-installed", "--quiet", "--report", str(report), "--target", str(Path(tmp) / "t"),
                 *PIP_TARGET, *TOP_LEVEL], "resolving the lock", env=pip_isolated_env())
        installs = json.loads(report.read_text())["install"]
    lines = sorted(f"{canonical(i['metadata']['name'])}=={i['metadata']['version']} "
                   f"--hash=sha256:{i['download_info']['archive_info']['hashes']['sha256']}" for i in installs)
    header = ["# The air-gapped x86_64 CUDA images (images/cuda): linux/amd64, CPython 3.11 (bookworm's python3),",
              "# manylinux wheels for glibc <= 2.36, the exact file of each pin by its sha256.",
              f"# Generated by `python3 images/cuda/build.py lock` from: {' '.join(TOP_LEVEL)}"]
    LOCK.write_text("\n".join(header + lines) + "\n", encoding="utf-8")
    return len(lines)


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def lock_pins(path: Path = LOCK) -> dict[str, tuple[str, str]]:
    """{name: (version, sha256)} of a lock written by resolve_lock."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            spec, hash_part = line.split(" --hash=sha256:")
            name, version = spec.split("==")
            pins[canonical(name)] = (version, hash_part.strip())
    return pins


# ---- wheelhouse

def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(functools.partial(handle.read, 1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def digest_of(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()


def wheelhouse_complete(lock_digest: str) -> bool:
    stamp = WHEELHOUSE / STAMP
    return stamp.is_file() and stamp.read_text().strip() == lock_digest


def make_wheelhouse(log: Log) -> str:
    """Download exactly the locked files (pip checks each hash); stamp the folder with the lock's digest."""
    lock_digest = digest_of(LOCK.read_bytes())
    if wheelhouse_complete(lock_digest):
        return "reused (stamp matches the lock)"
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    wanted = {sha for _, sha in lock_pins().values()}
    if wanted <= {file_sha256(p) for p in WHEELHOUSE.glob("*.whl")}:  # complete but unstamped: no index needed
        (WHEELHOUSE / STAMP).write_text(lock_digest + "\n")
        return f"reused ({len(wanted)} wheels, every locked sha256 present)"
    log.run([sys.executable, "-m", "pip", "download", "--isolated", "--cert", CA_BUNDLE, "--progress-bar", "off",
             "--no-deps", "--require-hashes", *PIP_TARGET, "-d", str(WHEELHOUSE), "-r", str(LOCK)],
            "downloading the wheelhouse", env=pip_isolated_env())
    present = {file_sha256(p) for p in WHEELHOUSE.glob("*.whl")}
    if wanted - present:
        raise BuildError(f"wheelhouse {WHEELHOUSE} lacks {len(wanted - present)} locked file(s) after download")
    (WHEELHOUSE / STAMP).write_text(lock_digest + "\n")
    return f"downloaded {len(wanted)} wheels"


@contextlib.contextmanager
def served(folder: Path):
    """An HTTP server on 127.0.0.1 (ephemeral port) that lists and serves `folder`; yields its URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


# ---- images

def image_label(tag: str, label: str) -> str | None:
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    return (json.loads(proc.stdout) or {}).get(label)


def image_id(tag: str) -> str | None:
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def tree_digest(paths: list[Path]) -> str:
    """Digest of files (relative names and contents), in a stable order."""
    parts: list[bytes | str] = []
    for path in sorted(paths):
        parts += [str(path.relative_to(ROOT)), path.read_bytes()]
    return digest_of(*parts)


def package_files() -> list[Path]:
    return [p for p in (ROOT / "grpo_deploy").rglob("*") if p.is_file() and "__pycache__" not in p.parts
            and p.suffix != ".pyc"]


def versions() -> dict[str, str]:
    pins = lock_pins()
    return {"VLLM_VERSION": pins["vllm"][0], "TRL_VERSION": pins["trl"][0], "PEFT_VERSION": pins["peft"][0],
            "CUDA": CUDA}


def build_args(args: dict[str, str]) -> list[str]:
    return [arg for key, value in args.items() for arg in ("--build-arg", f"{key}={value}")]


def build_image(log: Log, tag: str, dockerfile: Path, files: dict[str, Path], args: dict[str, str],
                input_hash: str, network_host: bool = False) -> str:
    """docker build of `dockerfile` from a staging context holding `files` (name -> source); reused when the
    image under `tag` carries the same input hash. Removes the image this build replaced (it was ours)."""
    if image_label(tag, "org.grpo-deploy.input-hash") == input_hash:
        return "reused (input hash matches)"
    old = image_id(tag)
    context = STAGING / tag.replace("/", "_").replace(":", "_")
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    for name, source in files.items():
        target = context / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    shutil.copy2(dockerfile, context / "Dockerfile")
    try:
        network = ["--network", "host"] if network_host else []
        log.run(["docker", "build", "--rm", *network, *build_args({**args, "INPUT_HASH": input_hash}),
                 "-t", tag, str(context)], f"building {tag}")
    finally:
        shutil.rmtree(context, ignore_errors=True)
    new = image_id(tag)
    if old and old != new and image_label(old, "org.grpo-deploy.input-hash"):
        subprocess.run(["docker", "image", "rm", old], capture_output=True, check=False)
    return f"built {new[7:19] if new else '?'}"


def deps_inputs() -> tuple[dict[str, Path], str]:
    files = {LOCK.name: LOCK, "verify-dists.py": ROOT / "images/common/verify-dists.py",
             "check-cuda.sh": ROOT / "images/common/check-cuda.sh"}
    return files, digest_of(tree_digest([*files.values(), HERE / "Dockerfile.deps"]), image_id(BASE_IMAGE) or "")


def role_inputs(deps_hash: str) -> tuple[dict[str, Path], str]:
    files = {"grpo_deploy": ROOT / "grpo_deploy", "common/create-user.sh": ROOT / "images/common/create-user.sh",
             "common/entrypoint.sh": ROOT / "images/common/entrypoint.sh", "check-image.py": HERE / "check-image.py"}
    paths = [*package_files(), *(p for n, p in files.items() if n != "grpo_deploy"), HERE / "Dockerfile"]
    return files, digest_of(tree_digest(paths), deps_hash)


def build_all(log: Log, uid: int, gid: int, verify: bool) -> None:
    started = time.monotonic()
    if image_id(BASE_IMAGE) is None:
        raise BuildError(f"base image {BASE_IMAGE} is not on this engine: build it first (make images builds it)")
    phase("wheelhouse", started, make_wheelhouse(log) + f" ({WHEELHOUSE.relative_to(ROOT)})")
    deps_tag = image_tags.deps_tag(ARCH)
    files, deps_hash = deps_inputs()
    if image_label(deps_tag, "org.grpo-deploy.input-hash") == deps_hash:
        phase("deps", started, f"{deps_tag} reused (input hash matches)")
    else:
        with served(WHEELHOUSE) as url:
            detail = build_image(log, deps_tag, HERE / "Dockerfile.deps", files,
                                 {"BASE_IMAGE": BASE_IMAGE, "WHEELS_URL": url, **versions()}, deps_hash,
                                 network_host=True)
        phase("deps", started, f"{deps_tag} {detail}")
    role_files, role_hash = role_inputs(deps_hash)
    for role, tag in ROLES.items():
        args = {"BASE_IMAGE": deps_tag, "ROLE": role, "UID": str(uid), "GID": str(gid), "KIT_VERSION": __version__,
                **versions()}
        detail = build_image(log, tag, HERE / "Dockerfile", role_files, args,
                             digest_of(role_hash, role, str(uid), str(gid)))
        phase(role, started, f"{tag} {detail}")
    if verify:
        for role, tag in ROLES.items():
            log.run(check_command(tag, role), f"in-image check of {tag}")
            phase("check", started, f"{tag} passed (n/a lines: see the log)")


def check_command(tag: str, role: str, script: Path | None = None) -> list[str]:
    """docker run of the in-image check with the image's own labels as the expected values (script: a host copy)."""
    labels = {k.removeprefix("org.grpo-deploy."): v for k, v in json.loads(subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag], capture_output=True, text=True,
        check=True).stdout).items()}
    mount = ["-v", f"{script}:/tmp/check-image.py:ro"] if script else []
    path = "/tmp/check-image.py" if script else "/opt/grpo-deploy/bin/check-image.py"
    expect = ["--role", role, "--uid", labels.get("uid", "1000"), "--gid", labels.get("gid", "1000"),
              "--cuda", labels.get("cuda-version", CUDA), "--vllm", labels.get("vllm-version", "?")]
    if labels.get("trl-version"):
        expect += ["--trl", labels["trl-version"]]
    return ["docker", "run", "--rm", *mount, tag, "python3", path, *expect]


# ---- the door

def run_id(text: str) -> int:
    """A UID/GID for the run user: a decimal number 1..2147483646 (0 is root)."""
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a decimal number")
    value = int(text)
    if not 0 < value < 2**31 - 1:
        raise argparse.ArgumentTypeError(f"{value} is outside 1..2147483646 (0 is root: the images run as non-root)")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        self.exit(2, f"build.py: {message} (see --help)\n")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="images/cuda/build.py", description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=("build", "lock"), default="build")
    parser.add_argument("--uid", type=run_id, default=1000, help="run user's UID (default 1000)")
    parser.add_argument("--gid", type=run_id, default=1000, help="run user's GID (default 1000)")
    parser.add_argument("--skip-verify", action="store_true", help="do not run the in-image check")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    log = Log(LOG)
    print(f"[cuda-images] log: {LOG}", flush=True)
    try:
        if options.action == "lock":
            print(f"[cuda-images] lock: {resolve_lock(log)} pins -> {LOCK.relative_to(ROOT)}")
        else:
            build_all(log, options.uid, options.gid, not options.skip_verify)
    except BuildError as error:
        print(f"[cuda-images] {error}; last lines of {LOG}:\n{log.tail()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
