"""Container health (`python3 -m grpo_deploy.runtime.health`, a HEALTHCHECK) and the trainer heartbeat; stdlib only.

Roles: server (vLLM lists the served model), trainer (fresh heartbeat file), head and worker (verl's Ray cluster: its
GCS answers at the address from RAY_ADDRESS or the one Ray records for the latest cluster it started here)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

from grpo_deploy.common.readback import ReadRefused, read_text
from grpo_deploy.runtime import run_token

DEFAULT_HEARTBEAT = "/tmp/grpo-deploy-trainer.heartbeat"
HEARTBEAT_ENV = "GRPO_HEARTBEAT_FILE"
ROLES = ("server", "trainer", "head", "worker")
RAY_CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"  # Ray writes the GCS address of the cluster it started here
RAY_DEFAULT_PORT = 6379


def heartbeat_path(explicit: str | None = None) -> str:
    return explicit or os.environ.get(HEARTBEAT_ENV) or DEFAULT_HEARTBEAT


class Heartbeat:
    """Touches a file every `interval` seconds from a daemon thread while the trainer process lives."""

    def __init__(self, path: str, interval: float = 10.0):
        self.path = path
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grpo-heartbeat", daemon=True)

    def beat(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {time.time():.3f}\n")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except OSError:
                pass

    def start(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # a beat in flight would re-create the file after the unlink below
            self._thread.join(timeout=max(5.0, 2 * self.interval))
        try:
            os.unlink(self.path)
        except OSError:
            pass


def server_healthy(port: int, model: str, timeout: float = 3.0, host: str = "127.0.0.1") -> tuple[bool, str]:
    """Whether `GET /v1/models` on host:port lists `model` (readiness, not just a live socket); the run's token sent
    when this process has one (the kit's front asks for it)."""
    url = f"http://{_bracketed(host)}:{port}/v1/models"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=run_token.env_headers()),
                                    timeout=timeout) as response:
            payload = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as error:
        return False, f"{url}: {error}"
    served = [entry.get("id") for entry in payload.get("data", [])]
    if model in served:
        return True, f"{model} is served"
    return False, f"{model} not in {served}"


def server_live(port: int, timeout: float = 3.0, host: str = "127.0.0.1") -> tuple[bool, str]:
    """Whether vLLM's `GET /health` on host:port answers 200 (its engine is alive: a liveness check, where the model
    list would still answer from a server whose engine died)."""
    url = f"http://{_bracketed(host)}:{port}/health"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=run_token.env_headers()),
                                    timeout=timeout) as response:
            status = response.status
    except (urllib.error.URLError, OSError, ValueError) as error:
        return False, f"{url}: {error}"
    return status == 200, f"{url} answered {status}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def first_token(port: int, model: str, timeout: float = 300.0, host: str = "127.0.0.1") -> tuple[bool, str]:
    """Whether a one-token completion of `model` answers (the server generates, not only lists the model)."""
    url = f"http://{_bracketed(host)}:{port}/v1/completions"
    body = json.dumps({"model": model, "prompt": "ok", "max_tokens": 1}).encode()
    request = urllib.request.Request(url, data=body,
                                     headers={"Content-Type": "application/json", **run_token.env_headers()})
    start = time.time()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            ok = bool(json.load(response).get("choices"))
    except (urllib.error.URLError, OSError, ValueError) as error:
        return False, f"{url}: {error}"
    return ok, f"one-token completion in {time.time() - start:.2f} s" if ok else f"{url}: no choices in the answer"


def trainer_healthy(path: str, max_age: float) -> tuple[bool, str]:
    """Whether the trainer's heartbeat file was touched within `max_age` seconds."""
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return False, f"no heartbeat at {path}"
    if age > max_age:
        return False, f"heartbeat {path} is {age:.0f}s old (limit {max_age:.0f}s)"
    return True, f"heartbeat {age:.0f}s old"


def ray_address(explicit: str | None = None, record: str = RAY_CURRENT_CLUSTER) -> str | None:
    """The Ray GCS address: --ray-address, else RAY_ADDRESS (a worker joins the head there), else the address Ray
    recorded when it started a cluster in this container (verl's main_ppo starts its own); None when none is known."""
    for value in (explicit, os.environ.get("RAY_ADDRESS")):
        if value and value != "auto":
            return value.removeprefix("ray://")
    try:
        recorded = read_text(record, 4096, "Ray's cluster record").strip()
    except ReadRefused:  # none, or not a small regular file: no address known
        return None
    return recorded or None


def ray_healthy(address: str | None, timeout: float = 3.0) -> tuple[bool, str]:
    """Whether the Ray cluster's GCS accepts a TCP connection at *address* (host:port)."""
    if not address:
        return False, f"no Ray cluster known here (no RAY_ADDRESS, nothing in {RAY_CURRENT_CLUSTER})"
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        host, port = address, str(RAY_DEFAULT_PORT)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        return False, f"Ray GCS {host}:{port} does not answer: {error}"
    return True, f"Ray GCS {host}:{port} answers"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.health", description=__doc__)
    parser.add_argument("--role", choices=ROLES, default=os.environ.get("GRPO_ROLE"))
    parser.add_argument("--model", default=os.environ.get("GRPO_SERVED_MODEL"), help="served model name (server)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRPO_SERVER_PORT") or 8000))
    parser.add_argument("--host", default="127.0.0.1", help="server address (default: this container)")
    parser.add_argument("--complete", action="store_true", help="also ask for a one-token completion (server)")
    parser.add_argument("--live", action="store_true",
                        help="server: only ask GET /health (the engine is alive), not whether the model is listed")
    parser.add_argument("--heartbeat", default=None, help=f"trainer heartbeat file (default ${HEARTBEAT_ENV})")
    parser.add_argument("--max-age", type=float, default=120.0, help="trainer heartbeat staleness limit, seconds")
    parser.add_argument("--ray-address", default=None, help="Ray GCS host:port (head, worker; default $RAY_ADDRESS, "
                        f"else {RAY_CURRENT_CLUSTER})")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.role == "server" and args.live:
        ok, why = server_live(args.port, args.timeout, args.host)
    elif args.role == "server":
        if not args.model:
            print("server health needs --model or GRPO_SERVED_MODEL", file=sys.stderr)
            return 2
        ok, why = server_healthy(args.port, args.model, args.timeout, args.host)
        if ok and args.complete:
            ok, why = first_token(args.port, args.model, host=args.host)
    elif args.role == "trainer":
        ok, why = trainer_healthy(heartbeat_path(args.heartbeat), args.max_age)
    elif args.role in ("head", "worker"):
        ok, why = ray_healthy(ray_address(args.ray_address), args.timeout)
    else:
        print(f"set --role or GRPO_ROLE to one of {', '.join(ROLES)}", file=sys.stderr)
        return 2
    print(("healthy: " if ok else "unhealthy: ") + why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
