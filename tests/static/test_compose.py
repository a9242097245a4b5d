"""Static checks of compose/: the committed defaults equal the renderer; the real Compose v2 binary accepts every
combination the deployer uses; the resolved services keep the kit's invariants (same user, same mount, readiness)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from grpo_deploy import render, spec
from grpo_deploy.render import committed
from grpo_deploy.spec import new_spec, resolve
from tests.specs import spec_yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def test_committed_defaults_match_the_renderer():
    for rel, text in committed.compose_files().items():
        path = COMPOSE / rel
        assert path.exists(), f"compose/{rel} missing: run make render-defaults"
        assert path.read_text() == text, f"compose/{rel} is stale: run make render-defaults"
    on_disk = {p.relative_to(COMPOSE).as_posix() for p in (COMPOSE / "rendered").rglob("*") if p.is_file()}
    assert on_disk == {r for r in committed.compose_files() if r.startswith("rendered/")}


def compose_config(env_file: Path | None = None, extra_env: dict[str, str] | None = None) -> dict:
    cmd = ["docker", "compose", "--project-directory", str(COMPOSE)]
    if env_file:
        cmd += ["--env-file", str(env_file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "COMPOSE_"))}
    env.update(extra_env or {})
    proc = subprocess.run(cmd + ["config", "--format", "yaml"], cwd=COMPOSE, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def _check_invariants(cfg: dict, mount: str = "/shared") -> None:
    server, trainer = cfg["services"]["server"], cfg["services"]["trainer"]
    assert server["user"] == trainer["user"] == "1000:1000"
    for svc in (server, trainer):
        targets = {v["target"]: v for v in svc["volumes"]}
        assert targets[mount]["source"] == "shared" and cfg["volumes"]["shared"]["name"].startswith("grpo-deploy")
        assert targets["/etc/grpo-deploy"]["read_only"] is True
    assert "grpo_deploy.runtime.health" in " ".join(server["healthcheck"]["test"])
    assert trainer["depends_on"]["server"]["condition"] == "service_healthy"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in server["environment"]


def test_default_compose_is_the_cpu_rehearsal():
    cfg = compose_config()
    _check_invariants(cfg)
    assert cfg["services"]["server"]["image"] == "grpo-deploy/cpu:0.1.0"
    assert cfg["services"]["server"]["ports"][0]["host_ip"] == "127.0.0.1"


@pytest.mark.parametrize("profile,hosts", [("cpu", []), ("gb10", ["spark1", "spark2"]), ("h200", ["h200a"])])
def test_rendered_host_env_files_are_accepted(tmp_path, profile, hosts):
    res = resolve.resolve(spec.loads(new_spec.spec_text(profile, "trl-async", hosts)))
    files = render.render_files(res, config_dir=str(tmp_path / "config"))
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for host in res.spec.hosts:
        cfg = compose_config(tmp_path / "hosts" / f"{host.name}.env")
        _check_invariants(cfg)
        if len(hosts) == 2:
            assert cfg["volumes"]["shared"]["driver_opts"]["type"] == "nfs"
        if profile != "cpu":
            roles = [r for r in host.roles]
            for role in roles:
                devices = cfg["services"][role]["deploy"]["resources"]["reservations"]["devices"]
                assert devices[0]["capabilities"] == ["gpu"]


def _render_to(tmp_path: Path, res) -> None:
    for rel, text in render.render_files(res, config_dir=str(tmp_path / "config")).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)


@pytest.mark.parametrize("profile,gpus", [("cpu", None), ("h200", {"server": [0, 1], "trainer": [2, 3]})])
def test_replicas_render_services_compose_accepts_each_with_its_own_port_and_gpus(tmp_path, profile, gpus):
    changes = {"hosts.0.replicas": 3 if profile == "cpu" else 2, **({"hosts.0.gpus": gpus} if gpus else {})}
    res = resolve.resolve(spec.loads(spec_yaml(profile, "trl-async", ("h",), **changes)))
    _render_to(tmp_path, res)
    cfg = compose_config(tmp_path / "hosts" / "h.env")  # with the env file's COMPOSE_PROFILES: the proxy too
    services = cfg["services"]
    replicas = ["server", "server-2", "server-3"][: changes["hosts.0.replicas"]]
    assert set(services) == {*replicas, "proxy", "trainer"}
    ports = [[p["published"] for p in services[name]["ports"]] for name in replicas]
    assert ports == [[str(8000 + k)] for k in range(len(replicas))]  # each its own port, none merged
    for name in replicas:
        assert services[name]["user"] == services["trainer"]["user"] == "1000:1000"
        assert services[name]["labels"]["org.grpo-deploy.role"] == "server"
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in services[name]["environment"]
    assert services["proxy"]["command"][-1] == "@/etc/grpo-deploy/proxy.args"
    if gpus:
        ids = {n: services[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for n in services
               if "deploy" in services[n]}
        assert ids == {"server": ["0"], "server-2": ["1"], "trainer": ["2", "3"]}


@pytest.mark.parametrize("profile", ["cpu", "h200"])
def test_trainer_hosts_render_compose_accepts_the_trainer_on_the_host_network_with_its_place(tmp_path, profile):
    changes = {"hosts.0.roles": ["trainer"], "hosts.1.roles": ["trainer"], "hosts.2.roles": ["server"],
               **({"hosts.1.infiniband": True, "hosts.1.interface": "ib0"} if profile == "h200" else {})}
    res = resolve.resolve(spec.loads(spec_yaml(profile, "trl-async", ("t1", "t2", "s"), **changes)))
    _render_to(tmp_path, res)
    for k, name in enumerate(("t1", "t2")):
        trainer = compose_config(tmp_path / "hosts" / f"{name}.env")["services"]["trainer"]
        assert trainer["network_mode"] == "host" and "ports" not in trainer
        assert trainer["environment"]["GRPO_MACHINE_RANK"] == str(k)
        assert trainer["environment"]["GRPO_MAIN_ADDRESS"] == "t1"
        if profile == "h200" and name == "t2":
            assert trainer["devices"][0]["source"] == "/dev/infiniband" and "IPC_LOCK" in trainer["cap_add"]
            assert trainer["environment"]["GRPO_SOCKET_IFNAME"] == "ib0"
    server = compose_config(tmp_path / "hosts" / "s.env")["services"]
    assert "network_mode" not in server["server"]


def test_trainer_hosts_override_requires_the_machine_rank():
    cmd = ["docker", "compose", "-f", "compose.yaml", "-f", "compose.trainer-hosts.yaml", "config", "-q"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "COMPOSE_"))}
    proc = subprocess.run(cmd, cwd=COMPOSE, capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "GRPO_MACHINE_RANK" in proc.stderr


def test_nfs_override_requires_its_variables():
    cmd = ["docker", "compose", "-f", "compose.yaml", "-f", "compose.nfs.yaml", "config", "-q"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "COMPOSE_"))}
    proc = subprocess.run(cmd, cwd=COMPOSE, capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "GRPO_NFS_ADDR" in proc.stderr
