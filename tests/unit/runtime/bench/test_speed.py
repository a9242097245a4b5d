"""The bench's speed rows (runtime/bench/speed.py): a row whose switch breaks in the exactness step is a row that
says how it failed, and the other rows are kept."""

from __future__ import annotations

from grpo_deploy.runtime.bench import report as bench_report
from grpo_deploy.runtime.bench import speed as bench_speed
from grpo_deploy.runtime.trainer import speed as trainer_speed


def test_a_switch_that_breaks_in_the_exactness_step_is_a_row_not_a_lost_report(monkeypatch):
    """On arm64 under QEMU, Inductor's C++ compile of the compiled rows failed inside the exactness step and the
    whole bench exited without a report; such a row now says how it failed, and the other rows are kept."""

    def check_row(label, model, batches, device, reference, today):
        if "compile" in label:
            raise RuntimeError("CppCompileError: C++ compile error")
        return {"switches": label, "loss": 1.0, "vs_fp32": {"loss": 0.0, "grad": 0.0},
                "vs_today": {"loss": 0.0, "grad": 0.0}, "tolerance": {"loss": 1.0, "grad": 1.0}, "exact": True,
                "_today": (1.0, None, None)}

    monkeypatch.setattr(bench_speed, "check_batches", lambda samples, budget: [])
    monkeypatch.setattr(bench_speed, "reference_step", lambda *args: (1.0, None))
    monkeypatch.setattr(bench_speed, "build_policy", lambda *args, **kwargs: object())
    monkeypatch.setattr(bench_speed, "check_row", check_row)
    rows = [trainer_speed.Switches.parse(t) for t in ("today", "compile+lora-ew", "bf16")]
    report = bench_speed.exactness(None, None, None, [], 128, "cpu", rows)
    checked = {r["switches"]: r for r in report["rows"]}
    assert checked["compile+lora-ew"] == {"switches": "compile+lora-ew",
                                          "failure": "RuntimeError: CppCompileError: C++ compile error"}
    assert checked["today"]["exact"] and checked["bf16"]["exact"]
    assert "CppCompileError" in bench_report.exactness_text({**report, "fp32_loss": 1.0})
