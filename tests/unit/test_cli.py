"""Tests of grpo_deploy.cli: help texts, init, render --check, not-built verbs, errors without tracebacks."""

import subprocess
import sys

import pytest

from grpo_deploy.cli import main
from grpo_deploy.spec import new_spec


def test_every_verb_has_help(capsys):
    for verb in ("init", "render", "plan", "preflight", "up", "status", "down", "logs", "profiles", "diagnose"):
        with pytest.raises(SystemExit) as exc:
            main([verb, "--help"])
        assert exc.value.code == 0
    assert "usage: grpo-deploy" in capsys.readouterr().out


def test_init_then_render_then_check(tmp_path, capsys):
    spec_path, out = tmp_path / "s.yaml", tmp_path / "out"
    assert main(["init", "--profile", "gb10", "--engine", "trl-async", "--hosts", "spark1,spark2",
                 "-o", str(spec_path)]) == 0
    assert main(["init", "--profile", "gb10", "--engine", "trl-async", "-o", str(spec_path)]) == 2  # exists
    assert main(["render", "-f", str(spec_path), "-o", str(out)]) == 0
    assert (out / "config" / "server.args").exists() and (out / "hosts" / "spark2.env").exists()
    assert main(["render", "-f", str(spec_path), "-o", str(out), "--check"]) == 0
    (out / "config" / "server.args").write_text("tampered\n")
    assert main(["render", "-f", str(spec_path), "-o", str(out), "--check"]) == 1
    assert "differs  config/server.args" in capsys.readouterr().out


def test_render_refuses_a_foreign_directory(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["render", "-o", str(tmp_path)]) == 2
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_checkpoints_prune_needs_a_retention_count(tmp_path, capsys):
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(new_spec.spec_text("cpu", "trl-async").replace("  keep: null ", "  keep: all  "))
    assert main(["checkpoints", "prune", "-f", str(spec_path)]) == 2  # keep all: nothing to prune to
    assert "pass --keep N" in capsys.readouterr().err


def test_up_with_remote_hosts_is_refused_clearly(tmp_path, capsys):
    spec_path = tmp_path / "s.yaml"
    main(["init", "--profile", "gb10", "--engine", "trl-async", "--hosts", "spark1,spark2", "-o", str(spec_path)])
    assert main(["up", "-f", str(spec_path), "--hosts", "spark1,spark9"]) == 2
    assert "does not match" in capsys.readouterr().err


def test_bad_free_space_is_a_clear_error(capsys):
    assert main(["plan", "--free-space", "local=lots"]) == 2
    assert "cannot read size" in capsys.readouterr().err


def test_a_second_up_of_the_same_run_is_refused_at_once(tmp_path):
    """While one `up` of a run holds its lock, another `up` of it from the same folder starts nothing."""
    from grpo_deploy.deploy import run_state
    from grpo_deploy.spec import resolve

    state = run_state.RunState(resolve.resolve(new_spec.embedded_default()), root=tmp_path / ".grpo-deploy")
    with state.up_lock():
        proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "up"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert "run rehearsal is already being started from this folder (`grpo-deploy up` in " in line
        assert not (state.dir / "render").exists()  # nothing rendered, built or started
    with state.up_lock():  # released by the holder: the next up may go
        pass


def test_a_second_up_of_the_same_run_from_another_folder_is_refused(tmp_path):
    """The run's containers are one set per Docker engine: an `up` of the same run name from another folder would
    recreate them under the first one (seen in a test run: the first run's server got SIGTERM)."""
    from grpo_deploy.deploy import run_state
    from grpo_deploy.spec import resolve

    first = run_state.RunState(resolve.resolve(new_spec.embedded_default()), root=tmp_path / "a" / ".grpo-deploy")
    other = tmp_path / "b"
    other.mkdir()
    with first.up_lock():
        proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "up"], cwd=other, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert "run rehearsal is already being started from another folder (`grpo-deploy up` in" in line
        assert not (other / ".grpo-deploy" / "rehearsal" / "render").exists()


def test_the_cli_runs_without_the_runtime_extra():
    # A plain `pip install grpo-deploy` has no torch (the runtime extra): building the parser must not import it.
    code = "import sys; sys.modules['torch'] = None\nfrom grpo_deploy import cli\nsys.exit(cli.main(['profiles']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_diagnose_adds_the_run_watchers_view(tmp_path, capsys, monkeypatch):
    """The recorded 40-step CPU rehearsal stands in for the hosts' events (deployer.events reads them live over SSH or
    Docker: the fake is that read, not the judging): the bottleneck, then the watcher's trend and its findings."""
    import json
    from pathlib import Path

    from grpo_deploy import deploy as deployer
    from grpo_deploy.common.metrics import read_events

    recorded = read_events(str(Path(__file__).parent / "metrics" / "cpu_rehearsal.jsonl"))
    monkeypatch.setattr(deployer, "events", lambda res, ssh: recorded)
    spec_path = tmp_path / "s.yaml"
    assert main(["init", "--profile", "cpu", "--engine", "trl-async", "-o", str(spec_path)]) == 0
    capsys.readouterr()
    main(["diagnose", "-f", str(spec_path)])
    text = capsys.readouterr().out
    assert "diagnosis: " in text and "run watcher         reward trend" in text, text
    assert "answers at the cap" in text  # the rehearsal's answers ran into its 24-token cap
    main(["diagnose", "-f", str(spec_path), "--json"])
    record = json.loads(capsys.readouterr().out)
    assert record["watch"]["step"] == 40 and record["watch"]["plateau_since"] is None  # a rising reward: not flat
    assert record["watch"]["cap_share_peak"] > 0.2 and record["watch_findings"] == []  # recorded before the watcher
