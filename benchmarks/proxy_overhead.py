"""Benchmark: what the replica proxy adds to one completion request, against the same request sent straight to a
replica on this machine. Prints its numbers; it is not a test.

Two fake, fast vLLM replicas (this script with --fake-replicas, one process, canned TRL-shaped answers) and the proxy
(`python3 -m grpo_deploy.runtime.serving.proxy`, its own process) run here; one client sends TRL's
/v1/completions payload (token-id prompts of 300 tokens from a pool of 64, so the affinity index is in play)
alternately straight to replica 0 and through the proxy, one request at a time on kept-alive connections, and prints
min / median / p90 of both and their difference. Target: median overhead under 2 ms.

Run: python3 benchmarks/proxy_overhead.py [--requests 2000]   (make bench-proxy)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_MEDIAN_MS = 2.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fake_replicas(ports: list[int]) -> None:
    """Serve /health, /v1/models and /v1/completions on each port with a canned answer (256 generated tokens)."""
    from aiohttp import web

    answer = json.dumps(
        {
            "id": "cmpl-fake",
            "object": "text_completion",
            "model": "tiny-qwen2",
            "choices": [
                {
                    "index": 0,
                    "text": "x" * 700,
                    "token_ids": list(range(1000, 1256)),
                    "logprobs": {"token_logprobs": [-0.5] * 256},
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": 300, "completion_tokens": 256},
        }
    ).encode()
    models = json.dumps({"object": "list", "data": [{"id": "tiny-qwen2", "max_model_len": 2048}]}).encode()

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        if request.path == "/v1/models":
            return web.Response(body=models, content_type="application/json")
        if request.path == "/v1/completions":
            return web.Response(body=answer, content_type="application/json")
        return web.Response(text="ok")

    async def serve() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for port in ports:
            await web.TCPSite(runner, "127.0.0.1", port).start()
        print("fake replicas up", flush=True)
        while True:
            await asyncio.sleep(3600)

    import asyncio

    asyncio.run(serve())


def wait_ready(port: int, path: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"127.0.0.1:{port}{path} did not answer 200 within {seconds:g} s")


def timed(conn: http.client.HTTPConnection, body: bytes) -> float:
    started = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    elapsed = time.perf_counter() - started
    if response.status != 200 or b"token_ids" not in data:
        raise SystemExit(f"completion answered {response.status}: {data[:200]!r}")
    return elapsed


def summary(samples: list[float]) -> tuple[float, float, float]:
    ms = sorted(s * 1000 for s in samples)
    return ms[0], statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]


def measure(requests: int, warmup: int) -> None:
    replica_ports, proxy_port = [free_port(), free_port()], free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--fake-replicas", *map(str, replica_ports)], env=env, stdout=subprocess.DEVNULL
        )
    ]
    try:
        wait_ready(replica_ports[0], "/health")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "grpo_deploy.runtime.serving.proxy",
                    "--listen",
                    f"127.0.0.1:{proxy_port}",
                    "--adapter-dir",
                    "/adapters",  # no adapter is loaded here
                    *[arg for port in replica_ports for arg in ("--replica", f"http://127.0.0.1:{port}")],
                ],
                env=env,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_ready(proxy_port, "/health")
        rng = random.Random(0)
        prompts = [[rng.randrange(150_000) for _ in range(300)] for _ in range(64)]
        bodies = [
            json.dumps(
                {
                    "model": "tiny-qwen2",
                    "prompt": p,
                    "max_tokens": 256,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "repetition_penalty": 1.0,
                    "n": 1,
                    "return_token_ids": True,
                    "logprobs": 0,
                    "seed": rng.getrandbits(63),
                }
            ).encode()
            for p in prompts
        ]
        direct = http.client.HTTPConnection("127.0.0.1", replica_ports[0], timeout=30)
        proxied = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=30)
        times: dict[str, list[float]] = {"direct": [], "proxy": []}
        for i in range(warmup + requests):
            body = bodies[i % len(bodies)]
            pair = [("direct", direct), ("proxy", proxied)]
            if i % 2:
                pair.reverse()  # alternate who goes first, so drift on a loaded machine falls on both
            for name, conn in pair:
                elapsed = timed(conn, body)
                if i >= warmup:
                    times[name].append(elapsed)
        stats = json.loads(_get(proxy_port, "/proxy/stats"))
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=10)
    d, p = summary(times["direct"]), summary(times["proxy"])
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
        f"{requests} requests each after {warmup} warm-up, one at a time, alternating"
    )
    print(f"{'':8}{'min ms':>9}{'median ms':>11}{'p90 ms':>9}")
    print(f"{'direct':8}{d[0]:9.3f}{d[1]:11.3f}{d[2]:9.3f}")
    print(f"{'proxy':8}{p[0]:9.3f}{p[1]:11.3f}{p[2]:9.3f}")
    print(f"{'overhead':8}{p[0] - d[0]:9.3f}{p[1] - d[1]:11.3f}{p[2] - d[2]:9.3f}")
    routing = stats["routing"]
    print(
        f"proxy routing: {routing['hits']} hits, {routing['misses']} misses, {routing['spills']} spills; "
        f"requests per replica {[r['requests'] for r in stats['replicas']]}"
    )
    verdict = "met" if p[1] - d[1] < TARGET_MEDIAN_MS else "NOT met"
    print(f"target: median overhead under {TARGET_MEDIAN_MS:g} ms: {verdict}")


def _get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    return conn.getresponse().read().decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="timed requests each way (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed requests first (default 200)")
    parser.add_argument("--fake-replicas", type=int, nargs="+", metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fake_replicas:
        fake_replicas(args.fake_replicas)
        return 0
    if not (10 <= args.requests <= 1_000_000 and 0 <= args.warmup <= 100_000):
        parser.error("--requests must be from 10 to 1,000,000 and --warmup from 0 to 100,000")
    measure(args.requests, args.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
