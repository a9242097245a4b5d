"""What `grpo-deploy tune` prints and writes: the table (seed 004's Table 3 by trial: step time, samples per hour,
answer and forward+backward tokens per second, peak memory, reward slope, objective, kept or not and why), the JSON
report, the reward-over-time plot, the spec diff, and `--apply`'s spec (the old one kept beside it, each changed key
named with the trial that justified it, written whole or not at all)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from grpo_deploy.common.table import table
from grpo_deploy.runtime.watch.series import fit
from grpo_deploy.spec.load import loads
from grpo_deploy.tune.decide import Trial, Verdict
from grpo_deploy.tune.knobs import apply_knob
from grpo_deploy.tune.loop import TuneRequest, TuneResult

COLUMNS = ("trial", "s/step", "samples/h", "answer tok/s", "fwd+bwd tok/s", "peak GiB", "reward/100 steps",
           "objective", "verdict")


def reward_slope(trial: Trial) -> float | None:
    """The reward's least-squares slope per 100 steps over the trial (None under 3 points)."""
    line = fit((step, reward) for step, _t, reward in trial.rewards) if len(trial.rewards) >= 3 else None
    return None if line is None else line.slope * 100


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def rows(result: TuneResult) -> list[list[str]]:
    """One row per trial, in the order they ran, with its round's verdict (baselines: `baseline`)."""
    verdicts = {id(v.trial): v for v in result.verdicts}
    out = []
    for t in result.trials:
        v = verdicts.get(id(t))
        if t.knob is None:
            verdict = "baseline" if t.ok else f"FAILED: {t.reason}"
        elif not t.ok:
            verdict = f"failed: {t.reason}"
        elif v is None:
            verdict = "not judged (the budget ended its round)"
        else:
            verdict = ("KEPT: " if v.kept else "not kept: ") + v.why
        out.append([t.label, _fmt(t.step_s if t.ok else None, ".2f"),
                    _fmt(t.samples_per_hour if t.ok else None, ",.0f"),
                    _fmt(t.extra.get("answer_tok_s"), ",.0f"), _fmt(t.extra.get("fwd_bwd_tok_s"), ",.0f"),
                    _fmt(t.extra.get("peak_gib"), ".1f"), _fmt(reward_slope(t), "+.3f"),
                    "changed" if t.objective else "unchanged", verdict])
    return out


def table_text(result: TuneResult) -> str:
    return table(list(COLUMNS), rows(result))


def report(result: TuneResult, request: TuneRequest, spec_source: str, run: str = "") -> dict[str, Any]:
    """The JSON report: the request, every trial (its figures and reward points), the verdicts, what was kept, and
    the step-time factor each first-round knob trial measured (what `plan` reads: measured_factors)."""
    return {
        "spec": spec_source, "run": run, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "factors": step_factors(result),
        "request": {"budget_min": request.budget_s / 60, "target": request.target, "knobs": request.knobs,
                    "steps": request.steps, "allow_objective_change": request.allow_objective_change},
        "sides": result.sides, "stopped": result.stopped, "interrupted": result.interrupted,
        "trials": [{"label": t.label, "knob": t.knob, "value": t.value, "ok": t.ok, "reason": t.reason,
                    "steps": t.steps, "wall_s": t.wall_s, "samples": t.samples,
                    "samples_per_hour": t.samples_per_hour if t.ok else None, "step_s": t.step_s if t.ok else None,
                    "reward_per_100_steps": reward_slope(t), "objective": t.objective, "extra": t.extra,
                    "rewards": [list(r) for r in t.rewards]} for t in result.trials],
        "verdicts": [{"trial": v.trial.label, "kept": v.kept, "why": v.why, "gain": v.gain, "noise": v.noise,
                      "measure": v.measure} for v in result.verdicts],
        "kept": {setting: {"value": value, "trial": label} for setting, (value, label) in result.kept.items()},
    }


def step_factors(result: TuneResult) -> dict[str, dict[str, Any]]:
    """knob -> {value, factor, trial}: the first round's knob trial's seconds per step over its baselines' mean (the
    fastest value of each knob); later rounds carry kept knobs, so their trials are not against the spec as written."""
    first = [t for t in result.trials if t.ok and t.step_s and (t.knob is None and t.label.startswith("baseline 1.")
                                                                 or t.knob is not None)]
    ends = [i for i, t in enumerate(result.trials) if t.label == "baseline 2.1"]
    first = [t for t in first if not ends or result.trials.index(t) < ends[0]]
    base = [t.step_s for t in first if t.knob is None]
    if not base:
        return {}
    mean = sum(base) / len(base)
    out: dict[str, dict[str, Any]] = {}
    for t in first:
        if t.knob is not None and (t.knob not in out or t.step_s / mean < out[t.knob]["factor"]):
            out[t.knob] = {"value": t.value, "factor": round(t.step_s / mean, 3), "trial": t.label,
                           "baselines": len(base)}
    return out


def measured_factors(tune_dir: Path, run: str) -> tuple[dict[str, dict[str, Any]], str]:
    """The newest tune report of run *run* under *tune_dir* (each folder's report.json, read bounded, never through a
    link): its factors and its date; ({}, "") when there is none or it cannot be read."""
    from grpo_deploy.common.readback import ReadRefused, read_text

    if not tune_dir.is_dir() or tune_dir.is_symlink():
        return {}, ""
    for folder in sorted((p for p in tune_dir.iterdir() if p.is_dir() and not p.is_symlink()), reverse=True):
        try:
            data = json.loads(read_text(folder / "report.json", 8 << 20, "a tune report"))
        except (ReadRefused, ValueError):
            continue
        if isinstance(data, dict) and data.get("run") == run and isinstance(data.get("factors"), dict):
            factors = {k: v for k, v in data["factors"].items() if isinstance(v, dict)
                       and isinstance(v.get("factor"), int | float) and 0 < v["factor"] < 100}
            return factors, str(data.get("date", ""))[:19]
    return {}, ""


def spec_diff(result: TuneResult) -> list[str]:
    """`setting: value  # tune: trial LABEL` for each kept knob."""
    return [f"{setting}: {json.dumps(value)}  # tune: trial {label!r}"
            for setting, (value, label) in result.kept.items()]


def tuned_data(user: dict, result: TuneResult) -> dict:
    data = user
    for setting, (value, _label) in result.kept.items():
        data = apply_knob(data, setting, value)
    return data


def apply(spec_path: Path, user: dict, result: TuneResult, verdicts: list[Verdict]) -> Path:
    """Write the tuned spec over *spec_path* (the old one kept as <name>.before-tune), atomically: a full disk leaves
    the old spec whole. Returns the path of the kept old spec."""
    why = {v.trial.label: v.why for v in verdicts if v.kept}
    header = [f"# tuned by `grpo-deploy tune` on {time.strftime('%Y-%m-%d')}: each changed key and the trial that "
              "justified it"]
    header += [f"#   {line}: {why.get(label, '')}".rstrip(": ")
               for line, (_s, (_v, label)) in zip(spec_diff(result), result.kept.items(), strict=True)]
    text = "\n".join(header) + "\n" + yaml.safe_dump(tuned_data(user, result), sort_keys=False)
    loads(text, source=f"{spec_path} as tuned")  # a tuned spec the loader refuses is never written
    before = spec_path.with_name(spec_path.name + ".before-tune")
    written = []
    try:
        for target, content in ((before, spec_path.read_text()), (spec_path, text)):
            fd, tmp = tempfile.mkstemp(prefix=".tune-", dir=spec_path.parent)
            written.append(tmp)
            with os.fdopen(fd, "w") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)  # the old spec is kept before the new one replaces it
    finally:
        for tmp in written:
            Path(tmp).unlink(missing_ok=True)
    return before


def plot(result: TuneResult, path: Path) -> Path | None:
    """The reward over wall time of every trial (baselines grey); None where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for t in result.trials:
        if t.ok and t.rewards:
            xs, ys = [p[1] / 60 for p in t.rewards], [p[2] for p in t.rewards]
            ax.plot(xs, ys, color="0.6" if t.knob is None else None, linewidth=1 if t.knob is None else 1.6,
                    label=t.label if t.knob is not None or t.label.endswith(".1") else None)
    ax.set_xlabel("minutes since the trial's first step")
    ax.set_ylabel("mean reward")
    ax.set_title("grpo-deploy tune: reward by trial")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
