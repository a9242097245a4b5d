"""vLLM server replicas across two real SSH test hosts (tests/testhosts.py): one replica on each, the trainer and the
kit's replica proxy beside the replica of spark1, the other replica reached over the network on spark2's published
port. The run trains to the end with every adapter load OK on both replicas, and both serve rollouts.

16 steps (24 until 2026-12-05, when it joined `make test`: 938 s beside a CI run then); `make test-replicas-hosts`
runs it alone (marker replicas_hosts)."""

from __future__ import annotations

import json

import pytest

from tests.clirun import run_cli as cli
from tests.compose import PROXY_STATS
from tests.specs import split_spec
from tests.testhosts import test_hosts

pytestmark = [pytest.mark.docker, pytest.mark.replicas_hosts]
RUN = "replicas"
STEPS = 16


@pytest.fixture(scope="module")
def run(tmp_path_factory, cpu_image):
    with test_hosts(2, tmp_path_factory.mktemp("hosts")) as hosts:
        cwd = tmp_path_factory.mktemp("replicas")
        spec = split_spec(cwd / "replicas.yaml", RUN, **{"hosts.0.roles": ["trainer", "server"],
                                                        "overrides": {"trl": {"max_steps": STEPS}}})
        ssh = ["--ssh-config", str(hosts.ssh_config)]
        up = cli("up", "-f", str(spec), "--fresh", "--keep", *ssh, cwd=cwd)
        status = cli("status", "-f", str(spec), "--json", *ssh, cwd=cwd, timeout=300)
        spark1 = hosts["spark1"]
        (proxy,) = spark1.exec(["docker", "ps", "-q", "--filter", f"label=org.grpo-deploy.run={RUN}", "--filter",
                                "label=com.docker.compose.service=proxy"]).split()
        stats = spark1.exec(["docker", "exec", proxy, "python3", "-c", PROXY_STATS])  # with the run's token
        cli("down", "-f", str(spec), *ssh, cwd=cwd, timeout=300)
        yield {"up": up, "status": json.loads(status.stdout) if status.returncode == 0 else {},
               "stats": json.loads(stats)}


def test_the_run_trains_to_the_end_through_the_proxy(run):
    up = run["up"]
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
    assert "starting 2 vLLM server replicas on spark1 (server), spark2 (server) behind the replica proxy" in up.stdout
    assert "from spark1: 1 replicas generate" not in up.stdout  # one remote replica: its own words
    s = run["status"]
    assert s["steps"] == STEPS and s["adapter_loads_failed"] == 0 and s["adapter_loads_ok"] >= s["steps"]
    assert s["reward_last5"] > s["reward_first5"] + 0.1, (s["reward_first5"], s["reward_last5"])


def test_both_replicas_took_every_adapter_and_served_rollouts(run):
    stats = run["stats"]
    urls = [r["url"] for r in stats["replicas"]]
    assert urls[0] == "http://server:8000" and urls[1].endswith(":8000") and "server" not in urls[1], urls
    loads = stats["adapter_loads"]["ok"]
    assert loads >= run["status"]["steps"] and stats["adapter_loads"]["failed"] == 0
    for r in stats["replicas"]:
        assert r["loads_ok"] == loads and r["loads_failed"] == 0 and r["requests"] > 0, r
    print(f"replicas across hosts: affinity share {stats['routing']['affinity_share']}; requests per replica "
          f"{[r['requests'] for r in stats['replicas']]}; adapter loads per replica "
          f"{[r['loads_ok'] for r in stats['replicas']]}")


def test_status_shows_each_replica_on_its_host(run):
    rows = {(h["host"], h["service"]) for h in run["status"]["hosts"]}
    assert {("spark1", "server"), ("spark1", "proxy"), ("spark1", "trainer"), ("spark2", "server"),
            ("spark2", "front")} <= rows, rows  # spark2's server faces spark1: the kit's front before it
