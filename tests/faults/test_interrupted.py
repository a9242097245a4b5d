"""Fault: `grpo-deploy up` stopped from outside while it starts the stack — Ctrl-C (SIGINT) or SIGTERM (a `kill`, a
closed terminal, a CI timeout): everything this `up` started is stopped, nothing of the run is left on the engine, the
record says so, exit 130."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from grpo_deploy.spec import new_spec
from tests.interrupt import sigint_default

RUN = "interrupted"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_up_rolls_back_everything(tmp_path, cpu_image, docker_client, fault_row, sig):
    name = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else "SIGTERM"
    fault_row.update(fault=f"{name} to `up` while server and trainer start (local)",
                     expected="everything this up started stopped and removed; exit 130; no traceback; the record "
                              "says failed")
    spec = tmp_path / "grpo-deploy.yaml"
    spec.write_text(new_spec.spec_text("cpu", "trl-async", run_name=RUN))
    proc = subprocess.Popen([sys.executable, "-m", "grpo_deploy.cli", "up", "--fresh"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=sigint_default)
    seen = []
    deadline = time.monotonic() + 900
    for line in proc.stdout:  # until the containers are being started
        seen.append(line)
        if "starting the vLLM server" in line or time.monotonic() > deadline:
            break
    assert any("starting the vLLM server" in line for line in seen), "".join(seen[-30:])
    time.sleep(8)  # the server and trainer containers exist now
    running = docker_client.containers.list(filters={"label": f"org.grpo-deploy.run={RUN}"})
    signalled = time.time()
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=300)
    out = "".join(seen) + rest
    print(out[-4000:])
    assert running, "nothing was running when the signal came: the test proves nothing"
    assert proc.returncode == 130 and "Traceback" not in out
    assert "rolling back: stopping what this up started" in out
    assert docker_client.containers.list(all=True, filters={"label": f"org.grpo-deploy.run={RUN}"}) == []
    events = [json.loads(line) for line in (tmp_path / ".grpo-deploy" / RUN / "deploy.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "up_end" and events[-1]["status"] == "failed"
    fault_row.update(observed=f"{len(running)} containers running at the signal; exit 130 after "
                              f"{time.time() - signalled:.1f} s, none of the run left, up_end failed",
                     **{"steps lost": "- (before step 1)", "data lost": "none"})
