"""Re-prints a recorded `grpo-deploy up` output (what a real run wrote to a pipe) through the kit's own terminal
path, so that it can be looked at in a terminal of any width without Docker or minutes of CPU: a replay, not a run.

Each recorded line goes back through the function that printed it: a `[HH:MM:SS] ...` progress line through
deploy.lifecycle.up_log (its recorded time), a preflight table through preflight.table_text (its rows read back from
the recorded table), a build step's start or end line and the run's summary through common.term.fit, as
image_build.progress.Step and deploy.supervise.report print them; anything else as it was. On a terminal the lines wrap
at its width; to a pipe they come out as they went in (tests/static/test_terminal.py checks both in tmux).

The build steps are shown as in a pipe (a start and an end line each); on a terminal a step that runs alone is one
line redrawn in place, which a replay cannot show.

Usage: PYTHONPATH=. python3 scripts/replay_up.py [RECORDED_LOG]   (default: tests/static/terminal/up_fresh_pipe.log)
       PYTHONPATH=. python3 scripts/replay_up.py --tmux COLUMNS OUT [RECORDED_LOG]
           the same replay in a tmux pane COLUMNS wide, what the pane shows written to OUT under a header that says
           what it is (docs/assets/up-80-columns.txt is made so)
"""

from __future__ import annotations

import re
import sys
from itertools import pairwise
from pathlib import Path

from grpo_deploy.common.term import fit
from grpo_deploy.deploy.lifecycle import up_log
from grpo_deploy.preflight import Result, table_text

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "static" / "terminal" / "up_fresh_pipe.log"
STAMPED = re.compile(r"^\[(\d\d:\d\d:\d\d)\] (.*)$")
TABLE_HEAD = re.compile(r"^check +host +verdict +fact / fix$")
STEP = re.compile(r"^(?P<name>[^\[ ][^:]*(?::[^ ][^:]*)*): (?P<text>started \(log: .*\)|.* \(\d+ s\))$")
FIX = "  -> fix: "


def table_results(lines: list[str]) -> list[Result]:
    """The preflight results a recorded table shows: its rows, a wrapped last cell joined back."""
    starts = [m.start() for m in re.finditer(r"-+", lines[1])]
    rows: list[list[str]] = []
    for line in lines[2:]:
        if line[:starts[-1]].strip():
            rows.append([line[a:b].strip() for a, b in pairwise(starts)] + [line[starts[-1]:].strip()])
        else:
            rows[-1][-1] += " " + line.strip()
    results = []
    for check, host, verdict, last in rows:
        fact, _, hint = last.partition(FIX.strip())
        results.append(Result(check, host, verdict.lower(), fact.strip(), hint.strip()))
    return results


def replay(recorded: list[str], out=sys.stdout) -> None:
    """Print *recorded* (the lines of an `up` output) to *out* through the kit's printing functions."""
    stamp = ["00:00:00"]
    log = up_log(out, clock=lambda: stamp[0])
    i = 0
    while i < len(recorded):
        line = recorded[i]
        if m := STAMPED.match(line):
            stamp[0] = m.group(1)
            log(m.group(2))
        elif TABLE_HEAD.match(line):
            end = i + 2
            while end < len(recorded) and not STAMPED.match(recorded[end]):
                end += 1
            print(table_text(table_results(recorded[i:end])), file=out)
            i = end
            continue
        elif line.startswith("note: "):
            print(fit(line.removeprefix("note: "), out, "note: "), file=out)
        elif m := STEP.match(line):
            print(fit(m.group("text"), out, f"{m.group('name')}: "), file=out)
        elif line.startswith("run ") and i and not recorded[i - 1]:
            end = recorded.index("", i) if "" in recorded[i:] else len(recorded)
            print(fit("\n".join(recorded[i:end]), out), file=out)
            i = end
            continue
        else:
            print(line, file=out)
        i += 1
    out.flush()


HEADER = """\
What `grpo-deploy up --fresh` shows in a terminal {columns} columns wide: the real
output of a rehearsal run (the cpu profile on an x86_64 machine, written to
a pipe), re-printed line by line through the kit's own printing functions in
a tmux pane of {columns} columns by scripts/replay_up.py, and captured. A replay of
a recorded run, not a live one: the times are the run's; a build step shows its
start and end lines as in a pipe.
{rule}
"""


def capture(columns: int, out: Path, recorded: Path) -> None:
    """The replay of *recorded* in a tmux pane *columns* wide, captured to *out* under HEADER."""
    from tests.tmux_pane import Tmux

    tmux = Tmux()
    try:
        pane = tmux.run([sys.executable, str(Path(__file__).resolve()), str(recorded)], columns)
    finally:
        tmux.close()
    if pane.rows != pane.joined:
        raise SystemExit("the terminal wrapped a row: the replay did not fit the pane")
    out.write_text(HEADER.format(columns=columns, rule="-" * columns) + "\n".join(pane.rows) + "\n")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--tmux"]:
        capture(int(argv[1]), Path(argv[2]), Path(argv[3]) if argv[3:] else RECORDED)
        return 0
    path = Path(argv[0]) if argv else RECORDED
    replay(path.read_text().splitlines())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
