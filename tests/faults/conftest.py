"""The fault suite's table: every fault test records what was injected, what the kit was expected to do, what it did,
the optimizer steps and data lost, and its verdict; the table is printed at the end of the session and written to
build/faults.json (README's "what we test" figures come from it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_deploy.runtime.table import table

from ..integration.conftest import cpu_image, docker_client  # noqa: F401 - the same real engine and cpu image

ROWS: list[dict] = []
OUT = Path(__file__).resolve().parents[2] / "build" / "faults.json"
COLUMNS = ("fault", "expected", "observed", "steps lost", "data lost", "verdict")


@pytest.fixture()
def fault_row(request):
    """A row of the table for this test; its verdict is the test's outcome, filled in after the test ran."""
    row = {"test": request.node.name, **{c: "-" for c in COLUMNS}}
    ROWS.append(row)
    yield row


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
