"""tests/ci_phases.py, the phase table's recorder: each directory's time less the image builds its tests waited for,
under it the modules of MODULE_MIN_S or more (slowest first, a build taken out of the module too) and the rest in one
row. The session's own recorder state is swapped out: these tests must not write into the table of the run they are
part of."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest

from tests import ci_phases


@pytest.fixture
def recorder(monkeypatch):
    monkeypatch.setattr(ci_phases, "_directory_s", defaultdict(float))
    monkeypatch.setattr(ci_phases, "_module_s", defaultdict(float))
    monkeypatch.setattr(ci_phases, "_builds", [])
    monkeypatch.setattr(ci_phases, "_current", [])
    return ci_phases


def _ran(recorder, nodeid: str, seconds: float) -> None:
    recorder.running(nodeid)
    recorder.add_report(SimpleNamespace(nodeid=nodeid, duration=seconds))


def test_modules_of_the_budget_stand_under_their_directory(recorder):
    _ran(recorder, "tests/faults/test_replica_kill.py::test_a", 150.0)
    _ran(recorder, "tests/faults/test_replica_kill.py::test_b[x]", 36.0)
    _ran(recorder, "tests/faults/test_server_kill.py::test_a", 158.0)
    _ran(recorder, "tests/faults/test_small.py::test_a", 4.0)
    _ran(recorder, "tests/faults/test_tiny.py::test_a", 2.5)
    _ran(recorder, "tests/unit/test_x.py::test_a", 1.0)
    rows = {r["phase"]: r["seconds"] for r in recorder.rows()}
    phases = [r["phase"] for r in recorder.rows()]
    assert rows["tests/faults"] == 350.5
    assert phases[:5] == ["tests/faults", "  tests/faults/test_replica_kill.py", "  tests/faults/test_server_kill.py",
                          "  2 other module(s) under 30 s each", "tests/unit"]
    assert rows["  tests/faults/test_replica_kill.py"] == 186.0 and rows["  2 other module(s) under 30 s each"] == 6.5
    assert "  tests/unit/test_x.py" not in rows  # no module of the budget there: no rows under it


def test_a_build_is_taken_out_of_the_directory_and_the_module_that_waited(recorder):
    recorder.running("tests/integration/test_rehearsal.py::test_a")
    recorder.record_build("cpu", 300.0)
    recorder.add_report(SimpleNamespace(nodeid="tests/integration/test_rehearsal.py::test_a", duration=420.0))
    rows = {r["phase"]: r["seconds"] for r in recorder.rows()}
    assert rows["tests/integration"] == 120.0 and rows["  tests/integration/test_rehearsal.py"] == 120.0
    assert rows["image build: cpu"] == 300.0
