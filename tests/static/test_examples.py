"""docs/examples/: each example spec is what its header says: `watcher-lessons.yaml` is the spec `init` writes for
the cpu rehearsal but for its run name, the three trl settings its header blames for the watcher's findings and the
answer-cap check turned on (init's `auto` leaves it off for the brevity task), and
it loads through the spec's door like any user's spec."""

from __future__ import annotations

import subprocess
import sys

import yaml

from grpo_deploy.spec.load import load
from tests.tmux_pane import ROOT

EXAMPLE = ROOT / "docs" / "examples" / "watcher-lessons.yaml"


def test_the_watcher_lessons_example_is_init_s_spec_but_for_the_settings_it_names(tmp_path):
    fresh = tmp_path / "default.yaml"
    subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "init", "--profile", "cpu", "--engine", "trl-async",
                    "-o", str(fresh)], check=True, capture_output=True, cwd=tmp_path)
    default, example = yaml.safe_load(fresh.read_text()), yaml.safe_load(EXAMPLE.read_text())
    assert example["overrides"] == {"trl": {"max_staleness": 1, "queue_maxsize": 64, "max_completion_length": 8}}
    assert example["run"]["name"] == "watcher-lessons"
    assert example["watch"] == {**default["watch"], "cap_share": 0.2} and default["watch"]["cap_share"] == "auto"
    assert {k: v for k, v in example.items() if k not in ("overrides", "run", "watch")} == \
        {k: v for k, v in default.items() if k not in ("overrides", "run", "watch")}
    header = EXAMPLE.read_text().split("\nversion:", 1)[0]
    for setting in ("max_completion_length 8", "a scoring queue of 64", "max_staleness 1", "`watch.cap_share` 0.2"):
        assert setting in header
    load(str(EXAMPLE))  # the spec's door: it validates
