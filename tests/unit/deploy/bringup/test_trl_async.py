"""Tests of grpo_deploy.deploy.bringup.trl_async's start order: on a GPU the server and the trainer share, the server
is ready
before the trainer starts (vLLM refuses to start unless gpu_memory_utilization of the GPU is free); on GPUs of their
own both start at once (the trainer builds its model while the server loads). The compose steps are recorded, not
run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo_deploy.deploy.bringup import trl_async as bringup
from grpo_deploy.spec import resolve
from tests.specs import loaded


def _dep(profile: str, **changes):
    res = resolve.resolve(loaded(profile, "trl-async", ("h",), **changes))
    steps: list[str] = []
    dep = SimpleNamespace(res=res, role_host=lambda role: "h",
                          state=SimpleNamespace(emit=lambda event, **kw: steps.append(f"event {event}")),
                          returning={})
    return dep, steps


def _record(monkeypatch, steps: list[str]) -> None:
    monkeypatch.setattr(bringup, "_up_servers", lambda dep, replicas: steps.append("up server"))
    monkeypatch.setattr(bringup, "_up_trainer", lambda dep: steps.append("up trainer"))
    monkeypatch.setattr(bringup, "_stop_trainers", lambda dep: steps.append("stop trainer"))
    monkeypatch.setattr(bringup, "wait_server", lambda dep, log, since, replicas=None: steps.append("server ready")
                        or 1.0)
    monkeypatch.setattr(bringup, "first_completion", lambda dep: steps.append("first completion"))


@pytest.mark.parametrize(("profile", "changes"), [("h100", {}),
                                                  ("h200", {"hosts.0.gpus": {"server": [0], "trainer": [0]}})])
def test_on_a_shared_gpu_the_server_is_ready_before_the_trainer_starts(monkeypatch, profile, changes):
    dep, steps = _dep(profile, **changes)
    _record(monkeypatch, steps)
    said: list[str] = []
    bringup.start(dep, said.append, {}, 0.0)
    assert bringup.shared_gpu(dep.res) == "host h GPU 0"
    assert steps == ["up server", "server ready", "event server_ready", "up trainer", "event trainer_started",
                     "first completion"]
    assert "then the trainer on h once it is ready (they share host h GPU 0" in said[0]
    steps.clear()
    bringup.restart(dep, said.append, "server")  # every server died: the same order, no start-up events
    assert steps == ["stop trainer", "up server", "server ready", "up trainer"]


def test_on_gpus_of_their_own_both_start_at_once(monkeypatch):
    dep, steps = _dep("h200")
    _record(monkeypatch, steps)
    said: list[str] = []
    bringup.start(dep, said.append, {}, 0.0)
    assert bringup.shared_gpu(dep.res) == ""
    assert steps == ["up server", "up trainer", "event trainer_started", "server ready", "event server_ready",
                     "first completion"]
    assert "the trainer builds its model while the server loads" in said[0]


class _Project:
    """A host's compose project as the bring-up sees it: containers by service, `up` recorded."""

    def __init__(self, containers: dict[str, dict]):
        self.containers, self.ups = containers, []

    def service(self, name, strict=False):
        return self.containers.get(name)

    container = service  # by role: the trainer's

    def up(self, *services):
        self.ups.append(services)

    def tail(self, cid, lines=15):
        return f"last lines of {cid}"


def _split(containers: dict[str, dict]):
    res = resolve.resolve(loaded("cpu", "trl-async", ("t", "s"), **{
        "hosts.0.address": "local", "hosts.1.address": "deploy@10.0.0.3", "hosts.0.roles": ["trainer"],
        "hosts.1.roles": ["server"]}))
    projects = {"t": _Project({"trainer": {"id": "t1", "state": "running", "exit_code": 0, "health": None}}),
                "s": _Project(containers)}
    dep = SimpleNamespace(res=res, project=projects.__getitem__, role_host=lambda role: "t",
                          role_project=lambda role: projects["t"])
    return dep, projects


def _c(cid, state="running", health="healthy", code=0):
    return {"id": cid, "state": state, "health": health, "exit_code": code}


def test_a_server_facing_another_host_is_started_and_ready_with_its_front():
    dep, projects = _split({"server": _c("s1"), "front": _c("f1", health="starting")})
    bringup._up_servers(dep, bringup._replicas(dep))
    assert projects["s"].ups == [("server", "front")]
    assert not bringup._server_ready(dep)  # the server is, its front not yet: the trainer's host would get a 502
    projects["s"].containers["front"] = _c("f1")
    assert bringup._server_ready(dep)
    del projects["s"].containers["front"]
    assert not bringup._server_ready(dep)


@pytest.mark.parametrize("state", ["exited", "restarting"])
def test_a_front_that_stops_or_restarts_fails_the_bring_up_with_its_last_lines(state):
    dep, _ = _split({"server": _c("s1"), "front": _c("f1", state=state, health=None, code=2)})
    said = r"(?s)the front of the vLLM server \(front\) stopped on s .*last lines of f1"
    with pytest.raises(bringup.LaunchError, match=said):
        bringup._server_ready(dep)
