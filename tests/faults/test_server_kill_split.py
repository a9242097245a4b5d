"""The split rehearsal through a fault: the cpu rehearsal over two SSH test hosts (tests/testhosts.py: their own
address, sshd and Docker engine; one host directory mounted at the same path in both stands in for NFS), the deployer
outside talking real SSH with a generated key and known_hosts: the server on spark2, the trainer on spark1, images
shipped over SSH. In the middle of the run the vLLM server is SIGKILLed on its own host: `status` must show it
within seconds, read over SSH; `up` restarts the server on spark2 and the trainer on spark1, which resumes from its
newest complete checkpoint and loads adapters on the new server; no more than one checkpoint interval is lost, and the
run still trains to the end with the reward risen. Then status, logs (per role and followed across hosts) and down.

Late in the same run, the server is made to keep serving the base model (the front's `serve-base-model` failpoint,
runtime/serving/failpoint.py: adapter loads acknowledged and never applied, completions naming the newest adapter
served by the base model, the model list still naming it): the trainer's served-policy check
(runtime/trainer/served_policy.py) must find the base model's answers under the newest adapter and, with
`watch.action: stop`, save and stop the run within STALE_STOP_WITHIN steps, in one `run watcher: stale policy` line.
Then the door, knocked on from outside spark2, and the run's token looked for everywhere it must not be.

One run carries all of it: the split rehearsal's checks, the split server kill's, the stale policy's and the door's
(they were runs of about 4, 8 and 5 minutes). The refusals on two hosts are in tests/integration/test_multihost.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from grpo_deploy.common.metrics import parse_events
from grpo_deploy.runtime.serving.failpoint import FAILPOINT_DIR, SERVE_BASE_MODEL
from grpo_deploy.runtime.trainer import served_policy
from tests.clirun import run_cli
from tests.faults.running import resumed_after_kill, up_with_faults
from tests.interrupt import sigint_default
from tests.specs import split_spec
from tests.testhosts import test_hosts

pytestmark = pytest.mark.docker
RUN = "split"
STEPS, SAVE_EVERY = 40, 4  # the rehearsal's 40 steps (its reward check needs them), saved often enough to resume
KILL_AT_STEP = 6  # saves at 4, 8, ...: the kill lands two steps past a checkpoint
STALE_AT = 30  # the front serves the base model from here: adapters before it were served for real (the check's proof)
STALE_STOP_WITHIN = served_policy.AFTER + 5  # three checked syncs after the first swallowed load, and the margin of the
# check's own thread and the front's one-second look-up of the failpoint file (docs/operations/watcher.md)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, cpu_image):
    with test_hosts(2, tmp_path_factory.mktemp("hosts")) as th:
        yield th


@pytest.fixture(scope="module")
def split_run(hosts, tmp_path_factory):
    """One `grpo-deploy up` across the two hosts, to the end through a server kill, then status, logs and down."""
    cwd = tmp_path_factory.mktemp("split")
    spec = split_spec(cwd / "split.yaml", RUN, **{"checkpoints.save_every": SAVE_EVERY, "watch.action": "stop",
                                                  "overrides": {"trl": {"max_steps": STEPS}}})
    ssh = ["--ssh-config", str(hosts.ssh_config)]
    run = {"cwd": cwd, "spec": spec}
    killed, stale = {}, {}

    def kill_server(step: int) -> None:
        killed["ps"] = process_lists(hosts)  # the trainer, the server and its front all running
        (server,) = hosts["spark2"].run_containers(RUN, "server")  # beside it: its front
        hosts["spark2"].exec(["docker", "kill", server])  # SIGKILL, inside the server's host
        killed.update(step=step, time=time.time())
        status = run_cli("status", "-f", str(spec), "--json", *ssh, cwd=cwd, timeout=120)
        rows = json.loads(status.stdout).get("hosts", []) if status.returncode == 0 else []
        killed["status"] = " ".join(f"{h['host']}:{h['state']}/{h['health']}" for h in rows if h["role"] == "server")
        killed["status_s"] = time.time() - killed["time"]

    def serve_base_model(step: int) -> None:
        """The failpoint file in the run's checkpoint folder on the share (the front mounts it), the run user's."""
        (lora,) = (hosts.shared_host_dir / "runs" / RUN).rglob(".vllm_lora")
        flag = lora.parent / FAILPOINT_DIR / SERVE_BASE_MODEL
        flag.parent.mkdir(exist_ok=True)
        flag.touch()
        for path in (flag.parent, flag):
            os.chown(path, 1000, 1000)
        stale.update(step=step, time=time.time(), flag=flag)

    code, output = up_with_faults(run, [(KILL_AT_STEP, kill_server), (STALE_AT, serve_base_model)], *ssh)
    print(output[-6000:])  # shown with a failing test's report
    stale["flag"].unlink()  # the door's checks below meet the real server again
    status = run_cli("status", "-f", str(spec), "--json", *ssh, cwd=cwd, timeout=300)
    server_logs = run_cli("logs", "-f", str(spec), "--role", "server", "--tail", "5", *ssh, cwd=cwd, timeout=300)
    door = knock(hosts, cwd)  # the run is over; the server and its front still run (`up` without --down)
    followed = follow_logs(cwd, "logs", "-f", str(spec), "--follow", "--tail", "3", *ssh)
    down = run_cli("down", "-f", str(spec), *ssh, cwd=cwd, timeout=300)
    yield {"code": code, "output": output, "killed": killed, "down": down, "server_logs": server_logs,
           "followed": followed, "cwd": cwd, "spec": spec, "door": door, "stale": stale,
           "status": json.loads(status.stdout) if status.returncode == 0 else {},
           "metrics": (cwd / ".grpo-deploy" / RUN / "metrics.jsonl").read_text()}


def process_lists(hosts) -> str:
    """Every process's command line on both hosts (their containers' processes included)."""
    every = r"for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f 2>/dev/null; echo; done"
    return "\n".join(hosts[name].exec(["sh", "-c", every]) for name in ("spark1", "spark2"))


def knock(hosts, cwd: Path) -> dict:
    """Requests to the server's published address from outside spark2 (this machine, as another host on the test
    network would): without the token, with it, a dev-mode call and an adapter load from outside the run's adapter
    folder; then what vLLM itself logged, and where the token's value shows up."""
    token = (cwd / ".grpo-deploy" / RUN / "run-token").read_text().strip()
    base = f"http://{hosts['spark2'].ip}:8000"

    def call(method: str, path: str, body: dict | None = None, auth: str | None = token) -> tuple[int, str]:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {auth}"} if auth else {})}
        request = urllib.request.Request(base + path, method=method, headers=headers,
                                         data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read(1 << 16).decode(errors="replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read(1 << 16).decode(errors="replace")

    answers = {
        "models without the token": call("GET", "/v1/models", auth=None),
        "models with a wrong token": call("GET", "/v1/models", auth=token[:-1] + ("A" if token[-1] != "A" else "B")),
        "models with the token": call("GET", "/v1/models"),
        "collective_rpc with the token": call("POST", "/collective_rpc", {"method": "report_device_id"}),
        "load from outside the adapter folder": call("POST", "/v1/load_lora_adapter",
                                                     {"lora_name": "trl-policy-v999", "lora_path": "/etc"}),
    }
    (server,) = hosts["spark2"].run_containers(RUN, "server")
    vllm_log = hosts["spark2"].exec(["sh", "-c", f"docker logs {server} 2>&1"])
    home = f"/home/deploy/.grpo-deploy/{RUN}"
    rendered = {name: hosts[name].exec(["sh", "-c", f"grep -rlF -- {token} {home} 2>/dev/null || true"]).split()
                for name in ("spark1", "spark2")}
    local = [str(p) for p in (cwd / ".grpo-deploy").rglob("*") if p.is_file() and p.name != "run-token"
             and token in p.read_text(errors="replace")]
    return {"token": token, "answers": answers, "vllm_log": vllm_log, "on_hosts": rendered, "local": local,
            "ps": process_lists(hosts)}


def follow_logs(cwd: Path, *args: str, seconds: float = 15) -> str:
    """`grpo-deploy logs --follow` for a while, then Ctrl-C (SIGINT): what it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "grpo_deploy.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=sigint_default)
    time.sleep(seconds)
    still_following = proc.poll() is None
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    print(f"$ grpo-deploy {' '.join(args)} (following: {still_following})\n{out[-3000:]}")
    return out


def test_split_rehearsal_trains_to_the_end(split_run):
    assert split_run["code"] == 0, split_run["output"][-4000:]
    assert "Traceback" not in split_run["output"]
    s = split_run["status"]
    assert s["steps"] >= 30 and s["adapter_loads_ok"] >= s["steps"]
    assert s["reward_last5"] > s["reward_first5"] + 0.1, (s["reward_first5"], s["reward_last5"])


def test_every_adapter_load_answered_ok_but_those_of_the_dead_server(split_run):
    """Every load succeeded, but those sent while the server was dead (between the kill and its restart)."""
    events = parse_events(split_run["metrics"])
    starts = [e["time"] for e in events if e["event"] == "run_start"]
    failed = [e for e in events if e["event"] == "adapter_load" and not e.get("ok")]
    outside = [e for e in failed if not split_run["killed"]["time"] - 1 <= e["time"] <= starts[-1]]
    assert outside == [], [(e["time"], e.get("error")) for e in outside]
    assert split_run["status"]["adapter_loads_failed"] == len(failed)


def test_server_killed_on_its_host_is_restarted_and_the_trainer_resumes(split_run, fault_row):
    killed, output = split_run["killed"], split_run["output"]
    fault_row.update(fault=f"vLLM server SIGKILL at step {KILL_AT_STEP} of {STEPS} (split: server on spark2, "
                           "trainer on spark1, over SSH)",
                     expected=f"status over SSH shows it within 15 s; server + trainer restarted on their hosts; "
                              f"resume from the newest complete checkpoint; <= {SAVE_EVERY} steps lost")
    assert "spark2:exited" in killed["status"] and "137" in killed["status"], killed
    assert killed["status_s"] < 15, killed
    assert split_run["code"] == 0, output[-4000:]
    assert "restarting the server and the trainer" in output and "server ready again" in output, output[-3000:]
    got = resumed_after_kill(split_run["metrics"], killed, stopped_at(split_run), SAVE_EVERY)
    fault_row.update(observed=f"status over SSH after {killed['status_s']:.1f} s: {killed['status']}; resumed from "
                              f"checkpoint-{got['resumed']}; {got['loads_after']} adapter loads on the new server, all "
                              f"OK; {got['last_step']}/{STEPS} steps",
                     **{"steps lost": got["lost"], "data lost": "none"})


def stopped_at(split_run) -> int:
    """The step the run's last attempt stopped at (the stale-policy stop, before STEPS)."""
    ends = [e for e in parse_events(split_run["metrics"]) if e["event"] == "run_end"]
    return int(ends[-1]["steps"])


def test_a_server_serving_the_base_model_is_caught_and_the_run_stops(split_run, fault_row):
    stale, output = split_run["stale"], split_run["output"]
    fault_row.update(
        fault=f"adapter loads acknowledged but never applied from step {stale['step']} of {STEPS} (the front's "
              "serve-base-model failpoint on spark2: loads swallowed, completions served by the base model, the "
              "model list still naming the adapter)",
        expected=f"the served-policy check finds the base model's answers under the newest adapter; watch.action: "
                 f"stop saves and stops within {STALE_STOP_WITHIN} steps, one line in `up`")
    assert split_run["code"] == 0, output[-4000:]
    # once as a progress line when found (the summary and `up`'s last line say it again as the reason of the stop)
    lines = [line for line in output.splitlines() if re.match(r"\[\d\d:\d\d:\d\d\] run watcher: stale policy: ", line)]
    assert len(lines) == 1 and "] stopped early: run watcher: stale policy: " in output, output[-4000:]
    assert "trl-policy-v" in lines[0], lines  # up's lines cut a long finding: the whole text is the event's
    events = parse_events(split_run["metrics"])
    ends = [e for e in events if e["event"] == "run_end"]
    assert ends[-1]["status"] == "stopped-early", ends
    stopped = stopped_at(split_run)
    (found,) = [e for e in events if e["event"] == "watch" and e.get("kind") == "stale_policy"]
    assert found["level"] == "stop" and found["verdict"] == "base", found
    assert "acknowledged but not applied" in found["message"] and found["adapter"] in lines[0], (found, lines)
    checks = [e for e in events if e["event"] == "served_policy"]
    before = [e for e in checks if e["time"] < stale["time"]]  # a check after it reads the base, whatever version
    # no check before the fault read the base: a noisy one judges nothing (the vLLM CPU server answered a base request
    # as the adapter now and then: 3 of 36 checks in one run); an unknown one (no answer) only while the server was dead
    # (a fresh CI run: the probe right after a load met the killed server through its front, HTTP 502)
    dead = (split_run["killed"]["time"] - 2, max(e["time"] for e in events if e["event"] == "run_start"))
    unjudged = [e for e in before if e["verdict"] == "unknown" and e.get("error") and dead[0] <= e["time"] <= dead[1]]
    judged = [e for e in before if e not in unjudged]
    assert judged and all(e["verdict"] in ("applied", "early", "noisy") for e in judged), (dead, before)
    assert len(unjudged) <= 2, unjudged  # the probes of the one or two loads that met the kill
    assert any(e["verdict"] == "applied" for e in before), before  # the server applied adapters before the fault
    assert all(e["listed"] is not False for e in checks), checks  # the list names them: the probe caught it
    assert stopped - stale["step"] <= STALE_STOP_WITHIN and stopped < STEPS, (stale["step"], stopped, checks[-5:])
    fault_row.update(
        observed=f"armed at step {stale['step']}; {found['adapter']} answered as the base (max |diff| "
                 f"{found['max_abs_diff']}, threshold {found['threshold']:.3g}); saved and stopped at step {stopped}, "
                 "`up` exit 0 with one line",
        **{"steps lost": 0, "data lost": "none"})


def test_status_shows_both_hosts(split_run):
    rows = {(h["host"], h["role"]): h for h in split_run["status"]["hosts"]}
    assert rows[("spark1", "trainer")]["state"] == "exited (code 0)"
    assert rows[("spark2", "server")]["state"] == "running" and rows[("spark2", "server")]["health"] == "healthy"


def test_status_measures_the_checkpoint_disk_on_the_trainer_host(split_run):
    disk = split_run["status"]["checkpoint_disk"]
    assert disk["filesystem"].startswith("spark1:") and disk["free_bytes"] > 0 and disk["checkpoint_bytes"] > 0
    assert disk["ok"] is (disk["free_bytes"] >= disk["checkpoint_bytes"] + disk["margin_bytes"])


def test_logs_per_role_and_followed_across_hosts(split_run):
    server = split_run["server_logs"]
    assert server.returncode == 0 and "===== host spark2" in server.stdout
    assert "===== host spark1" not in server.stdout  # spark1 runs only the trainer
    followed = split_run["followed"].splitlines()
    assert any(line.startswith("spark1 | ") for line in followed), followed[-20:]
    assert any(line.startswith("spark2 | ") for line in followed), followed[-20:]
    assert "Traceback" not in split_run["followed"]


def test_images_were_shipped_over_ssh(split_run, hosts):
    out = split_run["output"]
    assert "spark1: grpo-deploy/cpu:0.1.0" in out and "spark2: grpo-deploy/cpu:0.1.0" in out
    local = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", "grpo-deploy/cpu:0.1.0"],
                           capture_output=True, text=True).stdout.strip()
    assert hosts["spark1"].has_image("grpo-deploy/cpu:0.1.0") == local == hosts["spark2"].has_image(
        "grpo-deploy/cpu:0.1.0")


def test_server_published_only_on_the_address_the_trainer_uses(split_run, hosts):
    text = hosts["spark2"].exec(["sh", "-c", f"cat /home/deploy/.grpo-deploy/{RUN}/render/hosts/spark2.env"])
    assert f"GRPO_SERVER_PUBLISH={hosts['spark2'].ip}" in text.splitlines()
    assert "compose.front.yaml" in text  # what spark1 reaches there is the kit's front, asking for the run's token
    mode = hosts["spark2"].exec(["stat", "-c", "%a", f"/home/deploy/.grpo-deploy/{RUN}/secret/run-token.env"])
    assert mode.strip() == "600"


def test_the_door_asks_for_the_token_and_lets_only_the_kits_calls_through(split_run):
    door = split_run["door"]
    answers = door["answers"]
    assert answers["models without the token"][0] == 401, answers
    assert answers["models with a wrong token"][0] == 401, answers
    status, body = answers["models with the token"]
    assert status == 200 and "data" in json.loads(body), answers
    assert answers["collective_rpc with the token"][0] == 404, answers  # not on the allowlist: no replica asked
    status, body = answers["load from outside the adapter folder"]
    assert 400 <= status < 500 and "/etc" not in door["vllm_log"], (status, body)
    # vLLM lists its routes at start-up (/collective_rpc among them); a request that reached it would be logged
    assert "/collective_rpc HTTP" not in door["vllm_log"] and "trl-policy-v999" not in door["vllm_log"]
    assert '"GET /v1/models HTTP' in door["vllm_log"]  # the log does record requests: the one with the token


def test_the_token_is_in_no_rendered_file_log_or_command_line(split_run):
    door, token = split_run["door"], split_run["door"]["token"]
    assert len(token) >= 32
    assert door["on_hosts"] == {"spark1": [f"/home/deploy/.grpo-deploy/{RUN}/secret/run-token.env"],
                                "spark2": [f"/home/deploy/.grpo-deploy/{RUN}/secret/run-token.env"]}, door["on_hosts"]
    assert door["local"] == [], door["local"]
    texts = {"up": split_run["output"], "logs": split_run["server_logs"].stdout + split_run["server_logs"].stderr,
             "logs --follow": split_run["followed"], "vLLM's log": door["vllm_log"], "metrics": split_run["metrics"],
             "ps during the run": split_run["killed"]["ps"], "ps after it": door["ps"]}
    assert [name for name, text in texts.items() if token in text] == []


def test_down_leaves_no_container_of_the_run(split_run, hosts):
    assert split_run["down"].returncode == 0
    assert hosts["spark1"].run_containers(RUN) == [] and hosts["spark2"].run_containers(RUN) == []
