"""Benchmark: `grpo-deploy up` -> first optimizer step, against a bare vLLM server start on the same machine,
and the median adapter hand-off (save -> loaded). Prints its numbers; it is not a test.

The start-up figure leaves image building out: `up` records the seconds it spent building (event images_ready)
and the summary subtracts them; the build time is printed on its own line.

Needs a finished rehearsal in this directory (`make demo` writes .grpo-deploy/rehearsal/summary.json).
The bare start runs the same image with the same rendered server arguments and times until /v1/models lists
the model, i.e. the same readiness rule `up` waits on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from grpo_deploy.deploy import lifecycle as deploy
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.hosts import docker_api
from grpo_deploy.hosts.connect import SshOptions
from grpo_deploy.render.folder import parse_env
from grpo_deploy.runtime.health import server_healthy
from grpo_deploy.spec import new_spec, resolve

TARGET_RATIO = 2.0
TARGET_HANDOFF_S = 0.3


def bare_server_start(res, timeout: float = 900.0) -> float:
    client = docker_api.client()
    dep = Deployment(res, SshOptions())
    deploy.put_render(dep, {})  # the render `up` puts on this machine: the server's args and env files
    state = dep.state
    port = 18000
    model = res.settings.model.served_name
    for stale in client.containers.list(all=True, filters={"label": "org.grpo-deploy.managed-by=grpo-deploy-bench"}):
        stale.remove(force=True)  # an earlier bench that died before its cleanup
    start = time.time()
    container = client.containers.run(
        res.images["server"],
        ["python3", "-m", "grpo_deploy.runtime.serving.serve", "--args-file", "/etc/grpo-deploy/server.args"],
        detach=True, user=res.identities["server"].user, ports={"8000/tcp": ("127.0.0.1", port)},
        volumes={str(state.render_dir / "config"): {"bind": "/etc/grpo-deploy", "mode": "ro"}},
        environment=parse_env((state.render_dir / "config" / "server.env").read_text()), shm_size="1g",
        labels={"org.grpo-deploy.managed-by": "grpo-deploy-bench"})
    try:
        while time.time() - start < timeout:
            if server_healthy(port, model, timeout=2)[0]:  # the server's own healthcheck rule, which `up` waits on
                return time.time() - start
            container.reload()
            if container.status == "exited":
                raise RuntimeError(container.logs(tail=20).decode(errors="replace"))
            time.sleep(0.5)
        raise TimeoutError("bare server not ready")
    finally:
        container.remove(force=True)


def repeat_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 9:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number from 1 to 9 (e.g. make bench BENCH_REPEAT=3)")
    return int(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", default=".grpo-deploy/rehearsal/summary.json")
    parser.add_argument("--repeat", type=repeat_count, default=1,
                        help="bare server starts to time, 1 to 9 (the median is used)")
    args = parser.parse_args()
    summary_path = Path(args.summary)
    if not summary_path.exists():
        print(f"{summary_path} not found: run `make demo` first", file=sys.stderr)
        return 2
    summary = json.loads(summary_path.read_text())
    res = resolve.resolve(new_spec.embedded_default())
    bare = sorted(bare_server_start(res) for _ in range(args.repeat))
    bare_s = bare[len(bare) // 2]
    up_s = summary["up_to_first_step_s"]
    ratio = up_s / bare_s
    handoff = summary["median_handoff_s"]
    print("rehearsal start-up and hand-off (this machine)")
    print(f"  bare vLLM server start (ready: model in /v1/models)  {bare_s:7.1f} s   "
          f"(runs: {', '.join(f'{b:.1f}' for b in bare)})")
    print(f"  server ready inside `up`                              {summary['server_ready_s']:7.1f} s")
    print(f"  `up` -> first optimizer step (image build left out)   {up_s:7.1f} s")
    build_s = summary.get("images_build_s")
    print(f"  image build inside that `up` (reported apart)         "
          f"{'      -' if build_s is None else format(build_s, '7.1f')} s")
    print(f"  ratio up->first step / bare server start              {ratio:7.2f}     target <= {TARGET_RATIO}: "
          f"{'met' if ratio <= TARGET_RATIO else 'MISSED'}")
    print(f"  median adapter hand-off (save -> loaded)              {handoff:7.3f} s   target <= {TARGET_HANDOFF_S}: "
          f"{'met' if handoff <= TARGET_HANDOFF_S else 'MISSED'}")
    print(f"  steps {summary['steps']}, adapter loads {summary['adapter_loads_ok']} ok / "
          f"{summary['adapter_loads_failed']} failed, reward {summary['reward_first5']} -> {summary['reward_last5']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
