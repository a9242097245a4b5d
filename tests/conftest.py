"""Shared pytest fixtures: repo paths and spec helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo() -> Path:
    return REPO


# In CI (`make test` sets GRPO_NO_SKIPS=1) a skipped test is a failure: what this machine can run, CI runs.
# Tests that need hardware this machine lacks carry @pytest.mark.gpu and are deselected with -m "not gpu".
_SKIPPED: list[str] = []


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (run on the device machine, deselected in CI)")


def pytest_runtest_logreport(report):
    import os

    if report.skipped and os.environ.get("GRPO_NO_SKIPS") == "1":
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _SKIPPED:
        print(f"\nGRPO_NO_SKIPS: {len(_SKIPPED)} test(s) skipped, which CI counts as failures:")
        for nodeid in _SKIPPED:
            print(f"  {nodeid}")
        session.exitstatus = 1
