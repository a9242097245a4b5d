"""`grpo-deploy tune` for real on the CPU rehearsal, short: a spec of its own (run name, volume and vLLM port apart
from other runs on the engine), one knob allowed, 6-step trials, a budget that holds the two baselines and the knob's
trial. Every trial is a real `up` (vLLM CPU server + TRL trainer in containers); the tuner prints a line per trial
and its table, writes its report and leaves no container of a trial behind; --apply rewrites the spec only for a knob
it kept, and keeps the old spec beside it. (Marker `tune`: `make test` runs it; alone: `pytest -m tune`.)"""

from __future__ import annotations

import json

import pytest
import yaml

from grpo_deploy import spec as spec_module
from tests.clirun import run_cli
from tests.specs import spec_data

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.tune]
RUN = "tunetest"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, cpu_image, docker_client):
    cwd = tmp_path_factory.mktemp("tune")
    data = spec_data("cpu", "trl-async", (), **{"run.name": RUN, "storage.volume": "grpo-tune-test",
                                                 "overrides": {"vllm": {"port": 18231}}})
    spec = cwd / "grpo-deploy.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    before = spec.read_text()
    proc = run_cli("tune", "-f", str(spec), "--budget", "7", "--knobs", "inflight", "--steps", "6", "--apply",
                   cwd=cwd, timeout=1500)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    folders = sorted((cwd / ".grpo-deploy" / "tune").iterdir())
    yield {"proc": proc, "cwd": cwd, "spec": spec, "before": before, "folder": folders[-1],
           "left": [c.name for c in docker_client.containers.list(all=True)
                    if any(str(v).startswith(f"{RUN}-tune-") for v in c.labels.values())]}


def test_tune_runs_its_trials_for_real_and_ends_with_a_table(tuned):
    proc = tuned["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    trials = [ln for ln in lines if ln.startswith("trial ") and ": " in ln]  # not the table's header
    assert [t.split()[2].rstrip(":") for t in trials][:3] == ["baseline", "inflight=16", "baseline"], trials
    assert all("FAILED" not in t and " s/step, " in t and "samples/h" in t for t in trials), trials
    assert any(ln.startswith("round 1: diagnose says ") for ln in lines)
    assert any(ln.startswith("stopped: ") for ln in lines)


def test_the_report_holds_real_measurements(tuned):
    report = json.loads((tuned["folder"] / "report.json").read_text())
    runs = [t for t in report["trials"] if t["ok"]]
    assert len([t for t in runs if t["knob"] is None]) >= 2 and any(t["knob"] == "inflight" for t in runs)
    for t in runs:
        assert t["steps"] == 5 and t["wall_s"] > 0 and t["samples_per_hour"] > 0 and len(t["rewards"]) == 6
    assert {v["trial"] for v in report["verdicts"]} >= {"inflight=16"}
    assert (tuned["folder"] / "table.txt").read_text().count("\n") >= 4
    for n in range(1, len(report["trials"]) + 1):
        assert (tuned["folder"] / f"trial-{n}" / "up.log").is_file()


def test_apply_changes_the_spec_only_for_a_kept_knob(tuned):
    report = json.loads((tuned["folder"] / "report.json").read_text())
    loaded = spec_module.load(tuned["spec"])  # whatever happened, the spec is whole and valid
    if report["kept"]:
        assert loaded.spec.overrides["trl"]["max_inflight_tasks"] == 16
        assert (tuned["cwd"] / "grpo-deploy.yaml.before-tune").read_text() == tuned["before"]
    else:
        assert tuned["spec"].read_text() == tuned["before"]
        assert not (tuned["cwd"] / "grpo-deploy.yaml.before-tune").exists()


def test_no_container_of_a_trial_is_left(tuned):
    assert tuned["left"] == [], tuned["left"]
