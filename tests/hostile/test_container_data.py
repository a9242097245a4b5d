"""The door, what a container writes (issue 44, item 3): the metrics and events file, container logs and checkpoint
metadata come from processes that run a model and third-party code. `status`, `diagnose`, `logs`, `up`'s progress
lines and `checkpoints` print none of their control characters or terminal escapes (`logs --raw` does, on request),
and a malformed number in them is a counted, skipped line, never a traceback."""

from __future__ import annotations

import io
import json
import re
import time

import pytest

from grpo_deploy import deploy as deployer
from grpo_deploy.common.metrics import read_events
from grpo_deploy.deploy import checkpoints, lifecycle, run_view
from grpo_deploy.deploy.bringup.base import follow_steps
from grpo_deploy.deploy.deployment import Deployment
from grpo_deploy.deploy.run_state import RunState
from grpo_deploy.deploy.supervise import finish
from grpo_deploy.diagnose import trl_async, verl
from grpo_deploy.diagnose.base import diagnosis_text
from grpo_deploy.hosts.connect import SshOptions
from grpo_deploy.runtime.storage import checkpoints as manager
from grpo_deploy.runtime.watch.config import WatchConfig
from grpo_deploy.spec import new_spec, resolve
from tests.hostile.helpers import base_data, cli, write_spec
from tests.unit.runtime.storage.test_checkpoints import verl_checkpoint

# What a terminal would act on: a window title (OSC 0), a screen clear (CSI), an 8-bit CSI (red), a right-to-left
# override, a hyperlink (OSC 8), a DCS query, a carriage return, DEL, NUL and a bell.
PLANT = ("\x1b]0;pwned\x07" "\x1b[2J" "\x9b31m" "\u202e" "\x1b]8;;http://evil.example/\x1b\\" "\x1bP+q544e\x1b\\"
         "\r" "\x7f" "\x00" "\x07")
# Raw in the file (JSON lets them stand unescaped in a string): C1 and bidi controls.
RAW_PLANT = "\x9b2J\u2066gnp.exe\u2069\u202a"
BAD = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
SKIPPED_WHY = ["a line over 1 MiB", "a number that is not finite", "a number too long", "a value nested too deep",
               "an event without a time"]
NOTE = f"note: 7 lines of metrics.jsonl skipped ({', '.join(SKIPPED_WHY)})"


def assert_no_controls(text: str) -> None:
    """No control character but newline and tab, no C1, no bidi control (what `--json` promises: JSON escapes them)."""
    found = BAD.search(text)
    at = found.start() if found else 0
    assert found is None, f"{found.group()!r} at {at}: {text[max(0, at - 60):at + 20]!r}"


def assert_clean(text: str) -> None:
    """assert_no_controls, and nothing of an escape sequence's payload (the title, the link, the query) either."""
    assert_no_controls(text)
    assert "pwned" not in text and "evil.example" not in text and "544e" not in text and "31m" not in text, text
    assert "Traceback" not in text


def planted_text(t0: float = 100.0) -> str:
    """A trl-async run of 10 steps (rewards 0.1..1.0) whose every string carries escapes, plus lines that broke the
    reader before: a 10,000-digit number, 1e999, NaN, -Infinity, a 2 MB line, a value nested 100,000 deep, an event
    without a time, and a forged `lines_skipped` event."""
    events = [{"event": "up_start", "time": t0}, {"event": "server_ready", "time": t0 + 40, "seconds": 40.0},
              {"event": "run_start", "time": t0 + 41, "uid": 1000, "gid": 1000, "umask": "0022" + PLANT}]
    for i in range(1, 11):
        events.append({"event": "step", "time": t0 + 50 + 3 * i, "step": i, "reward": round(0.1 * i, 2),
                       "completions/mean_length": 20 - i, "sample/staleness_mean": 0.5, "ratio": 1.0,
                       "perf/step_s": 3.0, "perf/rollout_wait_s": 0.1, "perf/fwd_bwd_s": 2.5,
                       "queue/size": 10, "timing_s/" + PLANT: 1.0, "label" + PLANT: PLANT})
        events.append({"event": "adapter_load", "time": t0 + 50 + 3 * i, "ok": True, "handoff_s": 0.05,
                       "mode": "0600" + PLANT})
    events += [
        {"event": "watch", "time": t0 + 70, "kind": "plateau", "level": "warn", "step": PLANT,
         "message": "flat " + PLANT},
        {"event": "watch_summary", "time": t0 + 89, "enabled": True, "step": 10, "reward_trend": PLANT,
         "slope_per_step": 0.01, "gain_per_window": 1e308, "window": 5, "objective": "per answer" + PLANT,
         "active": [PLANT], "target_reward": 0.9, "time_to_target_s": 60.0, "time_to_target_steps": PLANT},
        {"event": "storage_fault", "time": t0 + 90, "kind": "adapter-unreadable", "message": "unreadable " + PLANT},
        {"event": "run_end", "time": t0 + 91, "status": "error" + PLANT, "error": "boom " + PLANT},
    ]
    lines = [json.dumps(e) for e in events]
    lines.append(json.dumps({"event": "watch", "time": t0 + 71, "kind": "cap", "level": "warn", "step": 4,
                             "message": "raw " + RAW_PLANT}, ensure_ascii=False))
    at = t0 + 85
    lines += [
        f'{{"event":"step","time":{at},"step":11,"reward":{"9" * 10000}}}',
        f'{{"event":"step","time":{at},"step":12,"reward":1e999}}',
        f'{{"event":"step","time":{at},"step":13,"reward":NaN}}',
        f'{{"event":"step","time":{at},"step":14,"reward":-Infinity}}',
        f'{{"event":"step","time":{at},"step":15,"pad":"{"x" * (2 << 20)}"}}',
        f'{{"event":"step","time":{at},"x":{"[" * 100000}{"]" * 100000}}}',
        '{"event":"step","step":16,"reward":0.5}',
        f'{{"event":"lines_skipped","time":{at},"source":"\\u001b[2J","lines":"x","why":5}}',
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> list[dict]:
    path = tmp_path_factory.mktemp("planted") / "metrics.jsonl"
    path.write_text(planted_text(), encoding="utf-8")
    return read_events(str(path))


def _spec(tmp_path):
    return write_spec(tmp_path, base_data("cpu"))


def _disk() -> dict:
    return {"free_bytes": 50e9, "checkpoint_bytes": 1e8, "margin_bytes": 1e9, "filesystem": "nfs" + PLANT, "ok": True}


# ------------------------------------------------------------------ the reader

def test_the_reader_skips_and_counts_each_malformed_line(planted):
    assert sum(e["event"] == "step" for e in planted) == 10
    (skipped,) = [e for e in planted if e["event"] == "lines_skipped"]
    assert skipped["lines"] == 7 and sorted(skipped["why"]) == SKIPPED_WHY, skipped
    assert skipped["why"]["a number that is not finite"] == 3


# ------------------------------------------------------------------ status

def test_status_text_prints_no_escape_and_keeps_the_figures(planted):
    from grpo_deploy import status

    text = status.summary_text(status.summarize("r", planted, max_steps=40, watch=WatchConfig()))
    assert_clean(text)
    assert "run r: failed, 10/40 optimizer steps" in text
    assert "first 5 steps 0.300 -> last 5 steps 0.800" in text and "uid 1000 gid 1000 umask 0022" in text
    assert "loss objective      per answer" in text and "watcher found       step : flat" in text
    assert "target 0.9 not in sight" in text  # a time to target that is text is no figure
    assert text.splitlines()[-1] == NOTE


def test_status_verb_answers_in_one_table_and_json_stays_json(tmp_path, planted, monkeypatch):
    hosts = [{"host": "local", "role": "trainer", "service": "trainer", "state": "running", "health": PLANT}]
    monkeypatch.setattr(deployer, "status_facts", lambda res, ssh: (hosts, planted, _disk()))
    spec = _spec(tmp_path)
    run = cli(["status", "-f", str(spec)], tmp_path)
    assert run.code == 0 and run.err == "", run.err
    assert_clean(run.out)
    assert run.out.count("note: ") == 1 and NOTE in run.out and "GB free" in run.out
    run = cli(["status", "-f", str(spec), "--json"], tmp_path)
    assert run.code == 0 and run.err == ""
    assert_no_controls(run.out)  # faithful JSON: json.dumps escapes every control character
    record = json.loads(run.out)
    assert record["umask"] == "0022"  # read back as one printable line
    assert record["skipped_lines"][0]["lines"] == 7 and record["reward_last5"] == 0.8


def test_a_huge_number_in_the_metrics_file_is_answered_in_one_line(tmp_path, monkeypatch):
    """A 60 MB number: the line is refused from its length (never parsed), the rest of the run is shown."""
    path = tmp_path / "metrics.jsonl"
    steps = [json.dumps({"event": "step", "time": 10.0 + i, "step": i, "reward": 0.5}) for i in range(1, 4)]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(steps[:2]) + '\n{"event":"step","time":12.5,"step":9,"reward":')
        f.write("9" * (60 << 20))
        f.write("}\n" + steps[2] + "\n")
    start = time.monotonic()
    events = read_events(str(path))
    monkeypatch.setattr(deployer, "status_facts", lambda res, ssh: ([], events, None))
    run = cli(["status", "-f", str(_spec(tmp_path))], tmp_path)
    assert time.monotonic() - start < 30
    assert run.code == 0 and run.err == "", run.err
    assert "running, 3/40 optimizer steps" in run.out
    assert [line for line in run.out.splitlines() if line.startswith("note:")] == \
        ["note: 1 line of metrics.jsonl skipped (a line over 1 MiB)"]


# ------------------------------------------------------------------ diagnose

def test_diagnose_prints_no_escape(tmp_path, planted, monkeypatch):
    for engine in (trl_async, verl):
        d = engine.diagnose(planted, {})
        assert_clean(diagnosis_text(d, engine.LABELS))
    monkeypatch.setattr(deployer, "events", lambda res, ssh: planted)
    spec = _spec(tmp_path)
    run = cli(["diagnose", "-f", str(spec)], tmp_path)
    assert run.err == "", run.err
    assert_clean(run.out)
    assert run.out.startswith("diagnosis: ") and run.out.rstrip().endswith(NOTE)
    run = cli(["diagnose", "-f", str(spec), "--json"], tmp_path)
    assert_no_controls(run.out)
    assert json.loads(run.out)["skipped_lines"][0]["lines"] == 7


FIGURES = {"1e308": 1e308, "-1e308": -1e308, "denormal": 5e-324, "10**30": 10**30, "10**5000": 10**5000,
           "inf": float("inf"), "nan": float("nan"), "text": "x" + PLANT, "bool": True, "list": [1], "dict": {"a": 1},
           "null": None}


@pytest.mark.parametrize("value", list(FIGURES.values()), ids=list(FIGURES))
def test_a_figure_that_is_no_finite_number_is_shown_as_a_dash(value):
    """Events handed over directly (not through the reader): every figure of every step is *value*."""
    from grpo_deploy import status

    base = [{"event": "step", "time": float(i), "step": i, "reward": 0.5, "timing_s/step": 2.0, "timing_s/gen": 1.0,
             "perf/step_s": 2.0, "actor/grad_norm": 1.0} for i in range(1, 12)]
    events = [{**e, **{k: value for k in e if k not in ("event", "time")}} for e in base]
    for engine in (trl_async, verl):
        assert_clean(diagnosis_text(engine.diagnose(events, {}), engine.LABELS))
    text = status.summary_text(status.summarize("r", events, max_steps=40, watch=WatchConfig()))
    assert_clean(text)
    assert not re.search(r"\b(inf|nan)\b", text, re.IGNORECASE), text
    assert_clean(status.progress_line(events[0], 40))


# ------------------------------------------------------------------ up's progress lines

def test_ups_progress_lines_print_no_escape(tmp_path, monkeypatch):
    from grpo_deploy import status

    assert_clean(status.progress_line({"step": PLANT, "reward": PLANT, "completions/mean_length": 1e999}, 40))
    monkeypatch.chdir(tmp_path)
    dep = Deployment(resolve.resolve(new_spec.embedded_default()), SshOptions())
    dep.state.dir.mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    text = planted_text(t0=time.time())
    code = follow_steps(dep, lifecycle.up_log(out), 0, "the trainer", lambda: ({"state": "exited"}, text, None),
                        lambda c, rest, last: 0)
    assert code == 0
    printed = out.getvalue()
    assert_clean(printed)
    assert "step 3/" in printed and "reward 0.300" in printed and "run watcher: flat" in printed
    state = RunState(resolve.resolve(new_spec.embedded_default()), root=tmp_path)
    events = read_events(str(dep.state.metrics_copy))
    out = io.StringIO()
    assert finish(state, 1, events, out, lifecycle.up_log(out), True, lambda: None, "the stack") == 1
    assert_clean(out.getvalue())
    assert "shared-volume fault (adapter-unreadable): unreadable" in out.getvalue() and NOTE in out.getvalue()
    dep.close()


# ------------------------------------------------------------------ logs

class _Project:
    def __init__(self, text: str):
        self.text = text

    def has_render(self) -> bool:
        return True

    def logs(self, tail=200, roles=None) -> str:
        return self.text

    def services_of(self, roles):
        return roles

    @staticmethod
    def logs_args(roles, tail, follow=False):
        return ["logs"]

    def compose_argv(self, *args):
        return ["docker", "compose", *args]


@pytest.mark.parametrize("follow", [False, True], ids=["tail", "follow"])
def test_logs_strip_escapes_unless_raw(tmp_path, monkeypatch, capsys, follow):
    monkeypatch.chdir(tmp_path)
    dep = Deployment(resolve.resolve(new_spec.embedded_default()), SshOptions())
    lines = [f"trainer-1  | step {i} {PLANT}done" for i in range(3)] + [f"server-1  | {RAW_PLANT}ready"]
    monkeypatch.setattr(Deployment, "project", lambda self, name: _Project("\n".join(lines)))
    for name in dep.hosts:
        monkeypatch.setattr(dep.hosts[name], "lines", lambda argv: iter(lines))
    assert run_view.logs(dep, [], follow=follow) == 0
    shown = capsys.readouterr().out
    assert_clean(shown)
    assert "step 2 done" in shown and "server-1  | gnp.exeready" in shown
    assert run_view.logs(dep, [], follow=follow, raw=True) == 0
    raw = capsys.readouterr().out
    assert "\x1b]0;pwned\x07" in raw and "\x9b31m" in raw and "\u202e" in raw


def test_the_logs_verb_offers_raw(tmp_path):
    run = cli(["logs", "--help"], tmp_path)
    assert run.code == 0 and "--raw" in run.out and "unfiltered" in run.out


def test_log_text_is_the_line_filter():
    assert run_view.log_text(f"a{PLANT}b\tc") == "ab\tc"
    assert run_view.log_text(f"a{PLANT}b", raw=True) == f"a{PLANT}b"


# ------------------------------------------------------------------ checkpoints

def test_checkpoint_listing_prints_no_escape():
    answer = {"layout": "trl", "directory": "/shared/ck" + PLANT, "host": "spark1", "exit_code": 0, "tracker": None,
              "checkpoints": [{"step": 4, "state": "complete" + PLANT, "size_bytes": 1000, "lora_r": PLANT,
                               "world_size": 1, "reason": "half" + PLANT}]}
    text = checkpoints.listing_text(answer)
    assert_clean(text)
    assert "1 checkpoint(s)" in text and "complete" in text
    pruned = {"dry_run": False, "removed": [{"step": PLANT, "size_bytes": 10}], "kept": [],
              "quarantined": [{"path": "/x" + PLANT, "moved_to": PLANT, "reason": PLANT}]}
    assert_clean(checkpoints.prune_text(pruned))


def test_checkpoint_metadata_with_huge_numbers_is_listed_not_a_traceback_or_a_hang(tmp_path):
    """A world size of 4,000 digits (JSON reads it: under Python's 4,300) once made the manager count ranks up to it;
    a folder named with a 30-digit step, a LoRA rank of 10,000 digits."""
    verl_checkpoint(tmp_path, 20)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("20")
    (tmp_path / "global_step_20" / "actor" / "fsdp_config.json").write_text(f'{{"world_size": {"7" * 4000}}}')
    (tmp_path / "global_step_20" / "actor" / "lora_train_meta.json").write_text(f'{{"r": {"8" * 10000}}}')
    (tmp_path / f"global_step_{'9' * 30}").mkdir()
    assert manager.shape_of(str(tmp_path / "global_step_20"), "verl").world_size is None
    found = manager.list_checkpoints(str(tmp_path), "verl")
    assert [(c.step, c.state, c.lora_r) for c in found] == [(20, "half-written", None)]
