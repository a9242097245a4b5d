"""tests/lanes.py, `make test` as two pytest sessions side by side: each lane's -m expression, the merge of both lanes'
phase and fault rows, and two real pytest sessions on a scratch test tree (one lane's failure is the run's)."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests import lanes


@pytest.mark.parametrize(("args", "main", "side"), [
    (["-m", "not gpu", "-rs"], ["-rs", "-m", "(not gpu) and not cluster"], ["-rs", "-m", "(not gpu) and cluster"]),
    (["-mnot gpu", "tests/x"], ["tests/x", "-m", "(not gpu) and not cluster"],
     ["tests/x", "-m", "(not gpu) and cluster"]),
    (["tests/x"], ["tests/x", "-m", "not cluster"], ["tests/x", "-m", "cluster"]),
])
def test_each_lane_gets_the_expression_and_its_side_of_the_marker(args, main, side):
    assert lanes.lane_args(args, "cluster") == (main, side)


def test_a_side_that_is_not_a_marker_name_is_refused_before_anything_runs(capsys):
    assert lanes.main(["--side", "x or True", "--", "tests/unit"]) == 2
    assert "is not a marker name" in capsys.readouterr().err
    assert lanes.main(["--side", "cluster", "--prebuild", "cpu,nope"]) == 2
    assert "nope unknown" in capsys.readouterr().err


def test_merge_puts_the_side_lanes_rows_under_its_wall_time_and_joins_the_fault_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(lanes, "BUILD", tmp_path)
    (tmp_path / "ci-phases.json").write_text(json.dumps({"wall_seconds": 10, "rows": [{"phase": "tests/unit",
                                                                                        "seconds": 9.0}]}))
    (tmp_path / "ci-phases-cluster.json").write_text(json.dumps({"rows": [{"phase": "tests/faults", "seconds": 700}]}))
    (tmp_path / "faults.json").write_text(json.dumps([{"fault": "a"}]))
    (tmp_path / "faults-cluster.json").write_text(json.dumps([{"fault": "b"}]))
    lanes.merge("cluster", 731.4)
    rows = json.loads((tmp_path / "ci-phases.json").read_text())["rows"]
    assert rows == [{"phase": "tests/unit", "seconds": 9.0},
                    {"phase": "side lane -m cluster (beside the rest; wall)", "seconds": 731.4},
                    {"phase": "  tests/faults", "seconds": 700}]
    assert [r["fault"] for r in json.loads((tmp_path / "faults.json").read_text())] == ["a", "b"]
    assert not (tmp_path / "ci-phases-cluster.json").exists() and not (tmp_path / "faults-cluster.json").exists()


def test_two_real_sessions_run_side_by_side_and_a_side_failure_fails_the_run(tmp_path, monkeypatch, capsys):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pytest.ini").write_text("[pytest]\nmarkers =\n    side_demo: the side lane\n")
    (tree / "test_main.py").write_text("def test_main():\n    assert True\n")
    (tree / "test_side.py").write_text(textwrap.dedent("""\
        import os
        import pytest

        @pytest.mark.side_demo
        def test_side():
            assert os.environ.get("GRPO_LANE") == "side_demo"
            assert False, "the side lane's own failure"
    """))
    monkeypatch.setattr(lanes, "BUILD", tmp_path / "build")
    assert lanes.run("side_demo", [str(tree), "-p", "no:cacheprovider"], []) == 1
    out = capsys.readouterr().out
    assert "[lanes] side lane -m side_demo: exit 1" in out and "the side lane's own failure" in out
    assert "1 failed" in (tmp_path / "build" / "lane-side_demo.log").read_text()
    (tree / "test_side.py").write_text("import pytest\n\n@pytest.mark.side_demo\ndef test_side():\n    pass\n")
    assert lanes.run("side_demo", [str(tree), "-p", "no:cacheprovider"], []) == 0


def test_no_side_test_selected_is_one_session(tmp_path, monkeypatch, capsys):
    (tmp_path / "test_only.py").write_text("def test_only():\n    assert True\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    side_demo: the side lane\n")
    monkeypatch.setattr(lanes, "BUILD", tmp_path / "build")
    assert lanes.run("side_demo", [str(tmp_path), "-p", "no:cacheprovider"], []) == 0
    assert "no test of -m side_demo is selected: one session" in capsys.readouterr().out


def test_several_side_markers_are_one_expression():
    main, side = lanes.lane_args(["-m", "not gpu"], "cluster,tune")
    assert main[-1] == "(not gpu) and not (cluster or tune)" and side[-1] == "(not gpu) and (cluster or tune)"
