"""grpo_deploy.runtime.verl.driver and node.release: verl's driver starts before Ray and joins it only on the head's
word (the real driver runs in the fault suite's verl rehearsals)."""

from __future__ import annotations

import io
import subprocess
import sys
import types

import pytest

from grpo_deploy.runtime.verl import driver
from grpo_deploy.runtime.verl import node as verl_node


def _ray():
    calls = []
    return types.SimpleNamespace(init=lambda *a, **k: calls.append((a, k)) or "joined"), calls


def test_ray_init_joins_only_after_the_heads_go():
    ray, calls = _ray()
    driver.hold_ray_init(ray, io.StringIO("go\n"))
    assert ray.init(address="auto", runtime_env={}) == "joined"
    assert calls == [((), {"address": "auto", "runtime_env": {}})]


@pytest.mark.parametrize("said", ["", "stop\n"])
def test_without_go_the_driver_ends_before_touching_ray(said, capsys):
    ray, calls = _ray()
    driver.hold_ray_init(ray, io.StringIO(said))
    with pytest.raises(SystemExit) as exc:
        ray.init()
    assert exc.value.code == driver.REFUSED and not calls
    assert "did not start" in capsys.readouterr().err


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_release_go_hands_the_word_over_and_a_refusal_waits_for_the_end():
    child = _child("import sys; print(sys.stdin.readline().strip())")
    verl_node.release(child, go=True)
    assert child.stdout.read().strip() == driver.GO and child.wait(timeout=30) == 0
    child = _child("import sys; sys.exit(7 if sys.stdin.readline() == '' else 0)")
    verl_node.release(child, go=False)
    assert child.returncode == 7  # waited for: ended on the closed stdin


def test_release_of_a_driver_that_already_ended_is_quiet_and_one_that_hangs_is_killed(monkeypatch):
    gone = _child("pass")
    gone.wait(timeout=30)
    verl_node.release(gone, go=True)  # a broken pipe is not an error: drive() reads its exit code
    monkeypatch.setattr(verl_node, "DRIVER_REFUSED_WAIT_S", 0.2)
    stuck = _child("import time; time.sleep(60)")
    verl_node.release(stuck, go=False)
    assert stuck.returncode is not None and stuck.returncode < 0
