"""The fault suite's table: every fault test records what was injected, what the kit was expected to do, what it did,
the optimizer steps and data lost, and its verdict; the table is printed at the end of the session and written to
build/faults.json (README's "what we test" figures come from it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_deploy import spec
from grpo_deploy.common.table import table
from grpo_deploy.spec import resolve
from tests.specs import spec_data

ROWS: list[dict] = []
RUN = "faults"
MAX_STEPS, SAVE_EVERY = 16, 4  # the rehearsal's workload, shorter and saved more often: each fault costs minutes


@pytest.fixture()
def fault_run(tmp_path):
    """A spec for one fault (the cpu rehearsal as run `faults`: 16 steps, a checkpoint every 4), written into a
    scratch folder, and its resolution; the run is stopped at the end whatever happened."""
    yield from _fault_run(tmp_path, {"trl": {"max_steps": MAX_STEPS}})


@pytest.fixture()
def two_process_run(tmp_path):
    """fault_run with a trainer of two processes (FSDP2 over gloo, sharded checkpoints)."""
    yield from _fault_run(tmp_path, {"trl": {"max_steps": MAX_STEPS}, "runtime": {"trainer_processes": 2}})


def _fault_run(tmp_path, overrides: dict):
    data = spec_data("cpu", "trl-async", (), **{"run.name": RUN, "checkpoints.save_every": SAVE_EVERY,
                                                 "overrides": overrides})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = resolve.resolve(spec.load(str(path)))
    assert (res.settings.trl.max_steps, res.settings.trl.save_steps) == (MAX_STEPS, SAVE_EVERY)
    yield {"cwd": tmp_path, "spec": path, "res": res, "state": tmp_path / ".grpo-deploy" / RUN}
    subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "down", "-f", str(path)], cwd=tmp_path,
                   capture_output=True, timeout=300)

OUT = Path(__file__).resolve().parents[2] / "build" / "faults.json"
COLUMNS = ("fault", "expected", "observed", "steps lost", "data lost", "verdict")


@pytest.fixture()
def fault_row(request):
    """A row of the table for this test; its verdict is the test's outcome, filled in after the test ran."""
    row = {"test": request.node.name, **{c: "-" for c in COLUMNS}}
    ROWS.append(row)
    yield row


def _extra_row(request) -> dict:
    row = {"test": request.node.name, **{c: "-" for c in COLUMNS}}
    ROWS.append(row)
    return row


@pytest.fixture()
def another_fault_row(request, fault_row):
    """A second row for a test that injects two faults into one run (it shares the test's verdict)."""
    yield _extra_row(request)


@pytest.fixture()
def third_fault_row(request, another_fault_row):
    """A third row, for a test that injects three faults into one run (it shares the test's verdict)."""
    yield _extra_row(request)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        for row in ROWS:
            if row["test"] == item.name:
                row["verdict"] = "pass" if report.passed else "FAIL"


def pytest_terminal_summary(terminalreporter):
    if not ROWS:
        return
    terminalreporter.write_line("\nfault suite (tests/faults):")
    terminalreporter.write_line(table(list(COLUMNS), [[str(r[c]) for c in COLUMNS] for r in ROWS]))
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(ROWS, indent=2))
    terminalreporter.write_line(f"(also written to {OUT})")
