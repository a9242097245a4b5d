"""Wheelhouses: `pip download` of exactly a lock's pinned wheels (hash-checked) for the image's platform, whatever the
host, into a folder that a `pip install --no-index` build reads; source-only packages built into wheels there."""

from __future__ import annotations

import contextlib
import html
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

from grpo_deploy.image_build import locks
from grpo_deploy.image_build.progress import Step, StepFailed, human
from grpo_deploy.image_build.recipes import Recipe, pip_flags

_COLLECTING = re.compile(r"^(?:Collecting|Processing) (\S+)")  # from an index | from a local file
_SIZE = re.compile(r"^\s*Downloading \S+ \((?P<n>[0-9.]+) (?P<unit>[kMG]?B)\)")
_UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def download_args(recipe: Recipe, requirements: Path, directory: Path) -> list[str]:
    """The pip command: --no-deps (the lock is the complete set; its hashes make pip check them), the recipe's
    platform and pip flags (default: this host's pip configuration, index and CA bundle, applies unchanged)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off",
            "--disable-pip-version-check", *pip_flags(recipe), *recipe.platform.pip_args(),
            "-d", str(directory), "-r", str(requirements)]


def run_logged(argv: list[str], step: Step, on_line=None) -> int:
    """Run argv with stdout+stderr into the step's log, line by line (on_line sees each)."""
    step.write(f"$ {' '.join(argv)}\n")
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                          stdin=subprocess.DEVNULL) as proc:
        for line in proc.stdout:
            step.write(line)
            if on_line:
                on_line(line)
    return proc.returncode


def ensure(recipe: Recipe, images: Path, directory: Path, log_dir: Path, lines_only: bool = False) -> Path:
    """Make *directory* hold every wheel of the recipe's lock (and its sdist lock's wheels); only what is missing is
    downloaded (progress as a start and an end line with *lines_only*). Returns the directory."""
    pins = locks.read(images / recipe.lock)
    directory.mkdir(parents=True, exist_ok=True)
    todo = locks.missing(pins, directory)
    sdists = _missing_sdists(recipe, images, directory)
    if not todo and not sdists:
        return directory
    with Step(f"wheelhouse {recipe.name}", log_dir / f"wheelhouse-{recipe.name}.log", lines_only=lines_only) as step:
        if todo:
            _download(recipe, todo, len(pins), directory, step)
        if sdists:
            _build_sdists(recipe, images, directory, step)
        step.done(f"{len(pins)} wheels in {directory}")
    return directory


@contextlib.contextmanager
def prefetched(recipe: Recipe, images: Path, directory: Path, log_dir: Path) -> Iterator[None]:
    """ensure() in a thread for the duration of the block (a fresh machine downloads the wheels while its base image
    is debootstrapped: both wait on the network); the block's end waits for it and raises what it raised. A block
    that fails leaves the download to the process's exit."""
    failure: list[BaseException] = []

    def fetch() -> None:
        try:
            ensure(recipe, images, directory, log_dir, lines_only=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=fetch, daemon=True, name=f"wheelhouse-{recipe.name}")
    thread.start()
    yield
    thread.join()
    if failure:
        raise failure[0]


def _download(recipe: Recipe, todo: list[locks.Pin], total: int, directory: Path, step: Step) -> None:
    seen, size = 0, 0.0

    def on_line(line: str) -> None:
        nonlocal seen, size
        if _COLLECTING.match(line):
            seen += 1
        m = _SIZE.match(line)
        if m:
            size += float(m.group("n")) * _UNITS[m.group("unit")]
        step.update(f"{seen}/{len(todo)} wheels ({total - len(todo)} already there), {human(size)} downloaded",
                    seen, len(todo))

    step.update(f"downloading {len(todo)} of {total} wheels", 0, len(todo))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="grpo-wheelhouse-") as reqs:
        reqs.write("".join(p.line + "\n" for p in todo))
        reqs.flush()
        code = run_logged(download_args(recipe, Path(reqs.name), directory), step, on_line)
    if code != 0:
        hint = " (torch's +cpu build comes from the PyTorch CPU index or a find-links folder: add it to pip's " \
               "configuration)" if recipe.name == "cpu" else ""
        raise StepFailed(f"pip download exited {code}{hint}")
    still = locks.missing(todo, directory)
    if still:
        raise StepFailed(f"still missing after the download: {', '.join(p.spec() for p in still[:8])}")


def _missing_sdists(recipe: Recipe, images: Path, directory: Path) -> list[locks.Pin]:
    if not recipe.sdist_lock:
        return []
    # The hashes are the archives'; the built wheels are matched by name and version only.
    return locks.missing(locks.read(images / recipe.sdist_lock), directory, check_hash=False)


def _build_sdists(recipe: Recipe, images: Path, directory: Path, step: Step) -> None:
    step.update("building wheels from hash-checked source archives")
    with tempfile.TemporaryDirectory(prefix="grpo-sdist-") as tmp:
        flags = pip_flags(recipe)
        code = run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", *flags,
                           "-d", tmp, "-r", str(images / recipe.sdist_lock)], step)
        archives = sorted(str(p) for p in Path(tmp).iterdir())
        if code == 0:
            code = run_logged([sys.executable, "-m", "pip", "wheel", "--no-deps", *flags, "-w", str(directory),
                               *archives], step)
    if code != 0:
        raise StepFailed(f"building wheels from {recipe.sdist_lock} failed (pip exited {code})")


@contextlib.contextmanager
def served(wheels: list[Path]) -> Iterator[str]:
    """Serve exactly *wheels* on 127.0.0.1, an ephemeral port, for a `pip install --no-index --find-links URL` inside
    a `docker build` on the host network: a directory listing of their names at /, each file at /NAME, 404 for
    anything else. Yields the URL; the server stops when the block ends."""
    files = {w.name: w for w in wheels}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            name = unquote(self.path.split("?", 1)[0].lstrip("/"))
            if name == "":
                body = "".join(f'<a href="{quote(n)}">{html.escape(n)}</a>\n' for n in sorted(files)).encode()
                self._send(200, "text/html", len(body))
                self.wfile.write(body)
            elif name in files:
                self._send(200, "application/octet-stream", files[name].stat().st_size)
                with files[name].open("rb") as handle:
                    shutil.copyfileobj(handle, self.wfile, 1 << 20)
            else:
                self._send(404, "text/plain", 0)

        def _send(self, code: int, kind: str, length: int) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(length))
            self.end_headers()

        def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's signature
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="wheelhouse-server")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
