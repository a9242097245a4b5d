"""A live `grpo-deploy up --fresh` (the embedded default: the cpu rehearsal on this machine; Docker and a few minutes
of CPU) run in a real tmux pane COLUMNS wide, and what the pane shows written to OUT under a header that says what it
is: the capture of a real run, as a user's terminal shows it (docs/assets/up-80-columns-live.txt is made so). The
run is stopped afterwards (`grpo-deploy down`); its shared volume is kept, as `up` keeps it.

Usage: PYTHONPATH=. python3 scripts/capture_up.py COLUMNS OUT   (run from the repository root)
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.tmux_pane import Tmux

WAIT_S = 1800  # a first `up` builds its images: minutes on 2 cores


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0].isdigit() or not 40 <= int(argv[0]) <= 400:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    columns, out = int(argv[0]), Path(argv[1])
    tmux = Tmux()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        pane = tmux.run([sys.executable, "-m", "grpo_deploy.cli", "up", "--fresh"], columns, wait_s=WAIT_S)
    finally:
        tmux.close()
        subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "down"], capture_output=True, timeout=300)
    header = (f"What `grpo-deploy up --fresh` showed in a real tmux pane {columns} columns wide: a live run of the "
              f"embedded default (the cpu rehearsal) on a {platform.machine()} machine with 2 cores, {started}, "
              "captured by scripts/capture_up.py (its images already built).")
    out.write_text("\n".join([textwrap.fill(header, columns), "-" * columns, *pane.rows]) + "\n")
    wide = [r for r in pane.rows if len(r) > columns]
    print(f"{out}: {len(pane.rows)} rows, {len(wide)} wider than {columns}")
    return 0 if not wide else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
