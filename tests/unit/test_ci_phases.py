"""tests/ci_phases.py, the phase table's recorder: each directory's time less the image builds its tests waited for,
under it the modules of MODULE_MIN_S or more (slowest first, a build taken out of the module too) and the rest in one
row. The session's own recorder state is swapped out: these tests must not write into the table of the run they are
part of."""

from __future__ import annotations

import json
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


def test_a_later_session_adds_its_rows_after_the_earlier_ones(recorder, monkeypatch, tmp_path):
    # make test's two sessions: the fast tiers on two workers, then the rest; one table of both.
    monkeypatch.setattr(recorder, "OUT", tmp_path / "ci-phases.json")
    _ran(recorder, "tests/unit/test_x.py::test_a", 50.0)
    _ran(recorder, "tests/static/test_y.py::test_a", 30.0)
    recorder.write(workers=2)
    first = json.loads(recorder.OUT.read_text())
    assert [r["phase"] for r in first["rows"]] == ["tests/static, tests/unit (2 workers side by side)",
                                                   "  tests/static: test time summed over the workers",
                                                   "  tests/unit: test time summed over the workers"]
    monkeypatch.setattr(recorder, "_directory_s", defaultdict(float))
    monkeypatch.setattr(recorder, "_module_s", defaultdict(float))
    _ran(recorder, "tests/faults/test_kill.py::test_a", 120.0)
    recorder.write(append=True)
    rows = json.loads(recorder.OUT.read_text())["rows"]
    phases = [r["phase"] for r in rows]
    assert phases[:3] == [r["phase"] for r in first["rows"]]  # the earlier session's rows first, whole
    assert phases[3:5] == ["tests/faults", "  tests/faults/test_kill.py"]
    assert phases.count(recorder.COLLECTION) <= 1 and (recorder.COLLECTION not in phases or phases[-1] ==
                                                        recorder.COLLECTION)
    recorder.write()  # not appending: the earlier rows are gone
    assert "tests/static, tests/unit (2 workers side by side)" not in json.loads(recorder.OUT.read_text())["rows"]


def test_the_collection_rows_of_two_sessions_become_one():
    merged = ci_phases.merged([{"phase": "a", "seconds": 1}, {"phase": ci_phases.COLLECTION, "seconds": 2.5}],
                              [{"phase": "b", "seconds": 3}, {"phase": ci_phases.COLLECTION, "seconds": 1.0}])
    assert merged == [{"phase": "a", "seconds": 1}, {"phase": "b", "seconds": 3},
                      {"phase": ci_phases.COLLECTION, "seconds": 3.5}]


def test_an_unreadable_or_linked_earlier_table_is_no_rows(monkeypatch, tmp_path):
    out = tmp_path / "ci-phases.json"
    monkeypatch.setattr(ci_phases, "OUT", out)
    out.write_text("{not json")
    assert ci_phases.read_earlier() == (0.0, [])
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"wall_seconds": 9, "rows": [{"phase": "x", "seconds": 9}]}))
    out.unlink()
    out.symlink_to(real)
    assert ci_phases.read_earlier() == (0.0, [])
