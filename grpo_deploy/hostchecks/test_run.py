"""Run checks (only with --run-checks): the running run on its hosts, each check on the host of the role it concerns.
The served model, port, run directory, adapter directory, identities and the server's rendered environment all come
from the resolved spec."""

from __future__ import annotations

import json
import os
import time

import pytest

from grpo_deploy.hosts.project import RemoteProject
from grpo_deploy.render import render_files
from grpo_deploy.render.folder import parse_env
from grpo_deploy.runtime.storage.adapters import LORA_SUBDIR

LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # vLLM serves /v1/load_lora_adapter only with it set
METRICS_TAIL_LINES = 2000


def _role(res, role: str):
    spec_host = res.host_for(role)
    if spec_host is None:
        pytest.skip(f"{res.engine} has no {role} role")
    return spec_host


def _container(conn, res, role: str, running: bool = True) -> dict:
    c = RemoteProject(conn, "", res.spec.run.name).container(role)
    assert c is not None, (f"{conn.name}: no {role} container of run {res.spec.run.name} -> start the run "
                           "(grpo-deploy up), or check without --run-checks")
    if running:
        assert c["state"] == "running", (f"{conn.name}: the {role} container {c['name']} is {c['state']} (exit "
                                         f"{c['exit_code']}) -> grpo-deploy logs; grpo-deploy up to resume")
    return c


def test_server_container_healthy(res, on_host):
    server = _role(res, "server")
    conn = on_host(server)
    c = _container(conn, res, "server")
    health = c["health"] or "without a health check"
    assert c["health"] == "healthy", (f"{server.name}: the server container {c['name']} is {health} (healthy = "
                                      "/v1/models lists the model) -> grpo-deploy logs")


def _published(conn, cid: str, port: int) -> tuple[str, str] | None:
    """(host:port, container port) of the binding on the host's port *port* (vllm.port: what the trainer and users
    dial; 0.0.0.0 / :: reached through loopback), or None when the server is not published on it."""
    r = conn.run(["docker", "port", cid])
    for line in r.out.splitlines():  # "8000/tcp -> 127.0.0.1:8000"
        inner, _, outer = line.partition(" -> ")
        host, _, published = outer.strip().rpartition(":")
        if published != str(port):
            continue
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host.strip("[]"), host.strip("[]"))
        return (f"[{host}]:{published}" if ":" in host else f"{host}:{published}"), inner.strip()
    return None


LIST_MODELS = ("import json,sys,urllib.request\n"
               "data = json.load(urllib.request.urlopen(sys.argv[1], timeout=10))\n"
               "print(json.dumps([m.get('id') for m in data.get('data', [])]))")


def test_served_model_listed(res, on_host):
    server = _role(res, "server")
    conn = on_host(server)
    c = _container(conn, res, "server")
    port, model = res.settings.vllm.port, res.settings.model.served_name
    published = _published(conn, c["id"], port)
    if published is not None:  # from the host, to the address and port the trainer and users dial
        where, inner = published
        url = f"http://{where}/v1/models (published to the container's {inner})"
        r = conn.run(["python3", "-c", LIST_MODELS, f"http://{where}/v1/models"])
        if r.rc == 127:
            r = conn.run(["sh", "-c", 'curl -fsS --max-time 10 "$0" | python3 -c "$1"', f"http://{where}/v1/models",
                          "import json,sys; print(json.dumps([m.get('id') for m in json.load(sys.stdin)['data']]))"])
    else:  # not published on this host: from inside the server container
        url = f"http://127.0.0.1:{port}/v1/models (in {c['name']})"
        r = conn.run(["docker", "exec", c["id"], "python3", "-c", LIST_MODELS, f"http://127.0.0.1:{port}/v1/models"])
    fix = "grpo-deploy logs"
    if published is not None and published[1] != f"{port}/tcp":
        fix = (f"the port is published to the container's {published[1]} but vLLM listens on {port} (vllm.port) "
               "there: publish it to the same container port")
    assert r.ok, f"{server.name}: GET {url} failed: {r.line()} -> {fix}"
    listed = json.loads(r.out.strip().splitlines()[-1])
    assert model in listed, (f"{server.name}: {url} lists {listed}, not the served model {model!r} "
                             "(model.served_name) -> the server is still loading, or serves another model")


def test_runtime_lora_loading_enabled(res, on_host):
    server = _role(res, "server")
    conn = on_host(server)
    c = _container(conn, res, "server")
    want = parse_env(render_files(res)["config/server.env"]).get(LORA_ENV)
    r = conn.run(["docker", "inspect", "--format", "{{json .Config.Env}}", c["id"]])
    env = dict(item.partition("=")[::2] for item in json.loads(r.out or "[]")) if r.ok else {}
    assert want is not None and env.get(LORA_ENV) == want, (
        f"{server.name}: the server container {c['name']} has {LORA_ENV}={env.get(LORA_ENV)!r}, the render says "
        f"{want!r}: vLLM answers 404 on /v1/load_lora_adapter (TRL: 'does not expose /v1/load_lora_adapter') -> "
        "restart the server from the kit's render (grpo-deploy down; grpo-deploy up)")


def _events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written, or not JSON
        if isinstance(event, dict) and isinstance(event.get("time"), int | float):
            out.append(event)
    return out


def test_trainer_progressing(res, on_host, pytestconfig):
    role = res.engine_info.main_role
    trainer = _role(res, role)
    conn = on_host(trainer)
    c = _container(conn, res, role)
    path = f"{res.run_dir}/metrics.jsonl"
    r = conn.run(["docker", "exec", c["id"], "tail", "-n", str(METRICS_TAIL_LINES), path])
    assert r.ok, f"{trainer.name}: cannot read {path} in {c['name']}: {r.line()}"
    events = _events(r.out)
    now = _host_clock(conn)
    limit_min = pytestconfig.getoption("max_step_age")
    steps = [e for e in events if e.get("event") == "step"]
    last = steps[-1] if steps else (events[-1] if events else None)
    assert last is not None, f"{trainer.name}: {path} holds no event yet"
    age_min = (now - last["time"]) / 60
    what = f"step {last.get('step')}" if steps else f"no step yet; the last event ({last.get('event')})"
    assert age_min <= limit_min, (f"{trainer.name}: {what} was {age_min:.1f} min ago in {path}; the limit is "
                                  f"{limit_min:g} min (--max-step-age) -> grpo-deploy status / grpo-deploy diagnose; "
                                  "grpo-deploy logs")


def _host_clock(conn) -> float:
    r = conn.run(["date", "+%s.%N"])
    try:
        return float(r.out.strip())
    except ValueError:
        return time.time()


def test_adapter_dir_readable_by_server(res, on_host):
    server = _role(res, "server")
    conn = on_host(server)
    c = _container(conn, res, "server")
    ident = res.identities["server"]
    folder = os.path.join(res.checkpoint_dir, LORA_SUBDIR)
    r = conn.run(["docker", "exec", "--user", ident.user, c["id"], "sh", "-c",
                  'test -d "$0" || exit 3; find "$0" ! -readable -print | head -n 20', folder])
    assert r.rc != 3, (f"{server.name}: the adapter directory {folder} does not exist in the server container yet "
                       "(the trainer publishes there after its first step) -> grpo-deploy status")
    assert r.ok and not r.out.strip(), (
        f"{server.name}: the server identity {ident.user} cannot read in {folder}: "
        f"{', '.join(r.out.split()) or r.line()} -> run both roles as the same UID/GID (remove run.roles overrides), "
        "umask 0022")
