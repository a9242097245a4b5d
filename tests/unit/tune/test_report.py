"""tune/report.py: the table by trial (a kept knob, an objective change, a failure, the baselines), the JSON report,
the spec diff, and --apply: the tuned spec valid and loadable, the old one kept beside it, each changed key named with
its trial; a write that fails leaves the spec whole."""

from __future__ import annotations

import json

import pytest
import yaml

from grpo_deploy import spec
from grpo_deploy.spec import new_spec
from grpo_deploy.tune import report
from grpo_deploy.tune.decide import Trial, Verdict
from grpo_deploy.tune.loop import TuneRequest, TuneResult


def _trial(label, knob=None, value=None, samples=1000, ok=True, reason="", objective="") -> Trial:
    rewards = tuple((s, s * 3.0, 0.1 + 0.02 * s) for s in range(1, 13))
    return Trial(label, knob, value, ok, reason, steps=11, wall_s=33.0 if ok else 0.0, samples=samples if ok else 0,
                 rewards=rewards if ok else (), objective=objective)


@pytest.fixture()
def result() -> TuneResult:
    base1, base2 = _trial("baseline 1.1"), _trial("baseline 1.2", samples=1010)
    inflight = _trial("inflight=16", "inflight", 16, samples=1600)
    packing = _trial("packing=512", "packing", 512, samples=1700, objective="per-token average over packed rows")
    failed = _trial("replicas=2", "replicas", 2, ok=False, reason="error: preflight: memory on local is short")
    verdicts = [Verdict(inflight, True, "+59% samples/h beyond the noise of 1%", 0.59, 0.01, "samples/h"),
                Verdict(packing, False, "faster (+69%) but it changes the objective", 0.69, 0.01, "samples/h"),
                Verdict(failed, False, "failed: error: preflight: memory on local is short", 0.0, 0.01, "samples/h")]
    return TuneResult(trials=[base1, inflight, packing, base2, failed], verdicts=verdicts,
                      kept={"overrides.trl.max_inflight_tasks": (16, "inflight=16")}, sides=["generation-bound"],
                      stopped="no knob's gain was beyond the measured noise")


def test_the_table_has_a_row_per_trial_with_its_verdict(result):
    rows = {r[0]: r for r in report.rows(result)}
    assert list(rows) == ["baseline 1.1", "inflight=16", "packing=512", "baseline 1.2", "replicas=2"]
    assert rows["baseline 1.1"][-1] == "baseline" and rows["inflight=16"][-1].startswith("KEPT: +59%")
    assert rows["packing=512"][-2] == "changed" and rows["inflight=16"][-2] == "unchanged"
    assert rows["packing=512"][-1].startswith("not kept: faster")
    assert rows["replicas=2"][1] == "-" and "memory on local is short" in rows["replicas=2"][-1]
    assert float(rows["inflight=16"][2].replace(",", "")) == pytest.approx(1600 / 33.0 * 3600, rel=1e-3)
    assert float(rows["inflight=16"][6]) == pytest.approx(2.0)  # +0.02 reward a step = +2 per 100 steps
    assert "inflight=16" in report.table_text(result)


def test_the_json_report_holds_every_trial_and_what_was_kept(result):
    data = json.loads(json.dumps(report.report(result, TuneRequest(1200, 0.5, None, 12), "s.yaml"), default=str))
    assert data["request"] == {"budget_min": 20.0, "target": 0.5, "knobs": None, "steps": 12,
                               "allow_objective_change": False}
    assert [t["label"] for t in data["trials"]] == [t.label for t in result.trials]
    assert data["kept"] == {"overrides.trl.max_inflight_tasks": {"value": 16, "trial": "inflight=16"}}
    assert len(data["trials"][0]["rewards"]) == 12


def test_apply_writes_a_valid_tuned_spec_and_keeps_the_old_one(tmp_path, result):
    path = tmp_path / "grpo-deploy.yaml"
    text = new_spec.spec_text("cpu", "trl-async", [])
    path.write_text(text)
    before = report.apply(path, yaml.safe_load(text), result, result.verdicts)
    assert before.read_text() == text
    tuned = spec.load(path)
    assert tuned.spec.overrides["trl"]["max_inflight_tasks"] == 16
    assert "# tuned by `grpo-deploy tune`" in path.read_text() and "trial 'inflight=16'" in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grpo-deploy.yaml", "grpo-deploy.yaml.before-tune"]


def test_a_failed_apply_leaves_the_spec_whole_and_no_scratch_file(tmp_path, result, monkeypatch):
    path = tmp_path / "grpo-deploy.yaml"
    text = new_spec.spec_text("cpu", "trl-async", [])
    path.write_text(text)

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report.os, "fsync", full_disk)
    with pytest.raises(OSError):
        report.apply(path, yaml.safe_load(text), result, result.verdicts)
    assert path.read_text() == text and [p.name for p in tmp_path.iterdir()] == ["grpo-deploy.yaml"]


def test_the_plot_is_written(tmp_path, result):
    out = report.plot(result, tmp_path / "reward.png")
    assert out is not None and out.stat().st_size > 1000
