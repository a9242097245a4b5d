"""One `grpo-deploy tune` from validated flags to files: the refusals before anything starts (an engine without
knobs, an unknown knob, --apply without a spec file, a budget that does not fit the baselines and one knob trial by
the forecast), the trials (tune.loop), then the table, the JSON report, the plot and the spec diff in the tune's own
folder, and the spec rewritten only with --apply."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from grpo_deploy import forecast
from grpo_deploy.common.shown import did_you_mean
from grpo_deploy.names import STATE_DIR
from grpo_deploy.spec.resolve import Resolved
from grpo_deploy.tune import decide, loop, report

TUNE_DIR = Path(STATE_DIR) / "tune"


class TuneRefused(ValueError):
    """A tune that must not start: one line, file/flag and fix; nothing was started or written."""


@dataclass(frozen=True)
class Start:
    """What `tune` checked before its first trial: the forecast of one trial and how many knob trials fit."""

    trial_s: float
    knob_trials: int
    source: str


def check_start(res: Resolved, request: loop.TuneRequest, spec_file: Path | None, apply: bool) -> Start:
    """Every refusal before a trial starts (TuneRefused, one line)."""
    knobs = res.engine_info.tune_knobs
    if not knobs:
        raise TuneRefused(f"tune is not built for engine {res.engine}: it has no knob table")
    names = {k.name for k in knobs}
    for name in request.knobs or ():
        if name not in names:
            raise TuneRefused(f"--knobs: {name!r} is not a knob of engine {res.engine}{did_you_mean(name, names)}; "
                              f"its knobs: {', '.join(sorted(names))}")
    if apply and spec_file is None:
        raise TuneRefused("--apply needs a spec file to rewrite: pass -f SPEC (or write ./grpo-deploy.yaml with "
                          "`grpo-deploy init`)")
    fc = forecast.make_forecast(res)
    step_s, startup_s = fc.figures["step_s"].value, fc.figures["startup_s"].value
    if step_s is None or startup_s is None:
        raise TuneRefused(f"no forecast of a trial for profile {res.profiles[res.spec.hosts[0].name].name}: run "
                          "`grpo-deploy up` once (its metrics give the step time) or `grpo-deploy bench trainer`")
    trial_s = startup_s + request.steps * step_s + loop.TEARDOWN_S
    fit = decide.trials_that_fit(request.budget_s, trial_s, baselines=loop.MIN_BASELINES)
    if fit < 1:
        need = (loop.MIN_BASELINES + 1) * trial_s / 60
        raise TuneRefused(f"--budget {request.budget_s / 60:g}: one trial of {request.steps} steps takes ~"
                          f"{trial_s / 60:.1f} min by the forecast ({startup_s:.0f} s start-up + {request.steps} x "
                          f"{step_s:.2f} s), so the {loop.MIN_BASELINES} baselines and one knob trial need "
                          f"~{need:.0f} min: raise --budget to {need:.0f} or more, or lower --steps")
    return Start(trial_s, fit, f"{fc.figures['step_s'].source}; {fc.figures['startup_s'].source}")


def run(res: Resolved, user: dict, request: loop.TuneRequest, spec_file: Path | None, apply: bool,
        ssh_args: list[str], say: Callable[[str], None]) -> int:
    """The whole tune; exit 0 when it ran to its end (kept or not), 1 when the baseline failed, 130 on Ctrl-C (the
    report of what was measured is written in every case)."""
    start = check_start(res, request, spec_file, apply)
    folder = TUNE_DIR / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=False)
    say(f"tune: {request.budget_s / 60:g} min budget; a trial of {request.steps} steps ~{start.trial_s / 60:.1f} min "
        f"(forecast), room for {start.knob_trials} knob trial(s) beside {loop.MIN_BASELINES} baselines; judged by "
        + (f"the time to reward {request.target:g}" if request.target is not None else "samples trained per hour")
        + f"; trials, logs and the report in {folder}/")
    result = loop.tune(user, res, request, folder, ssh_args, start.trial_s, say)
    (folder / "report.json").write_text(json.dumps(report.report(result, request, str(spec_file or "<embedded>"),
                                                                 res.spec.run.name),
                                                   indent=2, default=str))
    text = report.table_text(result)
    (folder / "table.txt").write_text(text + "\n")
    (folder / "spec-diff.txt").write_text("\n".join(report.spec_diff(result)) + "\n")
    plotted = report.plot(result, folder / "reward.png")
    say(text)
    say(f"stopped: {result.stopped}")
    if result.kept:
        say("kept (the spec diff):\n  " + "\n  ".join(report.spec_diff(result)))
    elif any(v.objective_refused for v in result.verdicts):
        faster = [v.trial.label for v in result.verdicts if v.objective_refused]
        say(f"kept: nothing; {', '.join(faster)} gained beyond the noise but change what the loss computes (see the "
            "table's objective column and report.json): --allow-objective-change keeps such a knob")
    elif any(t.knob is not None for t in result.trials):
        say("kept: nothing; the spec as it is was the fastest within the measured noise")
    else:
        say("kept: nothing; no knob was tried")
    say(f"report: {folder / 'report.json'}" + (f"; plot: {plotted}" if plotted else ""))
    if apply and result.kept and not result.interrupted and spec_file is not None:
        before = report.apply(spec_file, user, result, result.verdicts)
        say(f"applied to {spec_file} (the spec before: {before})")
    if result.interrupted:
        return 130
    return 1 if result.stopped.startswith("the baseline failed") else 0


def user_data(text: str) -> dict:
    """The spec's own YAML data (the text the loader validated), to be changed trial by trial."""
    return yaml.safe_load(text)
