"""grpo_deploy.deploy.supervise: EnginePatience (a slow Docker engine ridden out, a silent one ends `up` in one line,
real errors pass), restarts after a death mid-run, the words for container states."""

import io
import socket
import threading
import time

import docker
import pytest

from grpo_deploy.deploy.run_state import LaunchError
from grpo_deploy.deploy.supervise import EnginePatience, state_words


@pytest.fixture()
def silent_engine(tmp_path):
    """A unix socket that accepts connections and never answers: a real Docker SDK call on it times out."""
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield docker.APIClient(base_url=f"unix://{path}", timeout=1, version="1.41")
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_read_timeout_is_retried_then_ends_in_one_line(silent_engine):
    patience = EnginePatience("following the trainer", limit_s=1.5)
    start = time.time()
    with pytest.raises(LaunchError) as caught:
        for _ in range(10):
            try:
                silent_engine.containers()
            except Exception as exc:  # the real SDK exception type is what EnginePatience must recognise
                patience.failed(exc)
    assert time.time() - start >= 1.5, "gave up before the engine had been silent for the limit"
    line = str(caught.value)
    assert "\n" not in line and "did not answer for 2 s while following the trainer" in line
    assert "ReadTimeout" in line


def test_an_answer_resets_the_clock(silent_engine):
    patience = EnginePatience("waiting for the server", limit_s=1.5)
    for _ in range(3):  # three timeouts of 1 s each, each followed by an answer: never 1.5 s of silence
        try:
            silent_engine.containers()
        except Exception as exc:
            patience.failed(exc)
        patience.answered()
    assert patience.since is None


def test_an_error_that_is_not_the_engine_being_slow_is_raised_as_is():
    patience = EnginePatience("following the trainer")
    with pytest.raises(KeyError):
        patience.failed(KeyError("State"))
    not_found = docker.errors.NotFound("no such container")
    with pytest.raises(docker.errors.NotFound):
        patience.failed(not_found)


# ------------------------------------------------------------------ supervise: restarts after a death mid-run

from grpo_deploy.deploy.run_state import RunState  # noqa: E402
from grpo_deploy.deploy.supervise import KILLED, RoleDied, finish, supervise  # noqa: E402
from grpo_deploy.spec import new_spec, resolve  # noqa: E402


def scripted_follow(outcomes):
    """A follow() that plays *outcomes* in order: an int is the trainer's exit code, a RoleDied is raised."""
    calls = []

    def follow(since):
        calls.append(since)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, RoleDied):
            raise outcome
        return outcome

    return follow, calls


def state(tmp_path):
    return RunState(resolve.resolve(new_spec.embedded_default()), root=tmp_path)


def test_a_dead_server_is_restarted_and_the_run_continues(tmp_path):
    follow, calls = scripted_follow([RoleDied("server", KILLED, 22), RoleDied("trainer", KILLED, 31), 0])
    restarted, lines = [], []
    st = state(tmp_path)
    code = supervise(st, lines.append, 100.0, 2, follow, lambda role: restarted.append(role) or 5.0)
    assert code == 0 and restarted == ["server", "trainer"] and len(calls) == 3
    assert calls[0] == 100.0 and calls[1] > 100.0  # after a restart only the resumed trainer's steps are printed
    assert "vLLM server exited with code 137 (SIGKILL" in lines[0] and "at step 22" in lines[0]
    assert "restarting the server and the trainer" in lines[0] and "restart 1 of 2" in lines[0]
    assert "restarting the trainer;" in lines[1] and "restart 2 of 2" in lines[1]
    died = [e for e in st.deploy_events() if e["event"] == "role_died"]
    assert [(e["role"], e["step"]) for e in died] == [("server", 22), ("trainer", 31)]


def test_restarts_used_up_end_the_run_in_one_line(tmp_path):
    follow, _ = scripted_follow([RoleDied("server", 1, 5), RoleDied("server", KILLED, 9)])
    restarted = []
    with pytest.raises(LaunchError) as caught:
        supervise(state(tmp_path), lambda line: None, 0.0, 1, follow, lambda role: restarted.append(role) or 1.0)
    assert restarted == ["server"]
    line = str(caught.value)
    assert "\n" not in line and "at step 9" in line and "1 restart(s) allowed (--restarts) are used up" in line
    assert "grpo-deploy logs --role server" in line


def test_no_restart_for_a_trainer_that_failed_on_its_own(tmp_path):
    follow, calls = scripted_follow([1])
    assert supervise(state(tmp_path), lambda line: None, 0.0, 2, follow, lambda role: pytest.fail(role)) == 1
    assert len(calls) == 1


def test_poll_returns_what_the_engine_answers_and_gives_up_on_a_silent_one(silent_engine):
    assert EnginePatience("x").poll(lambda: 42, pause_s=0) == 42
    with pytest.raises(LaunchError, match="did not answer for 2 s while following the trainer"):
        EnginePatience("following the trainer", limit_s=1.5).poll(silent_engine.containers, pause_s=0.1)


def test_state_words_name_the_exit_code_and_what_137_means():
    assert state_words("running", None) == "running"
    assert state_words("exited", 0) == "exited (code 0)"
    assert state_words("exited", 137) == "exited (code 137 (SIGKILL: killed, or out of memory))"
    assert state_words("dead", 1) == "dead (code 1)"


def test_finish_names_a_shared_volume_fault_in_ups_output(tmp_path):
    st = state(tmp_path)
    message = "adapter unreadable: the vLLM server could not read adapter trl-policy-v6 at /shared/x ..."
    events = [{"event": "run_start", "time": 1.0},
              {"event": "storage_fault", "time": 2.0, "kind": "adapter-unreadable", "message": message},
              {"event": "run_end", "time": 3.0, "status": "storage-fault", "error": message, "steps": 5}]
    lines, out = [], io.StringIO()
    assert finish(st, 1, events, out, lines.append, True, lambda: pytest.fail("--keep"), "the stack") == 1
    assert lines[-2] == f"the trainer stopped on a shared-volume fault (adapter-unreadable): {message}"
    assert f"stopped by          {message}" in out.getvalue() and "Traceback" not in out.getvalue()


def test_finish_says_the_disk_watchdogs_own_line_when_it_stopped_the_run(tmp_path):
    st = state(tmp_path)
    message = ("disk watchdog: 0.01 GB free at /shared/runs/x/checkpoints, the next save needs 0.01 GB (...): "
               "stopped before saving; the newest complete checkpoint (global_step_4) is kept. Free 0.00 GB ...")
    events = [{"event": "run_start", "time": 1.0},
              {"event": "disk_watchdog_stop", "time": 2.0, "step": 5, "message": message},
              {"event": "run_end", "time": 3.0, "status": "disk-full", "error": message, "steps": 5}]
    lines, out = [], io.StringIO()
    assert finish(st, 3, events, out, lines.append, True, lambda: pytest.fail("--keep"), "the stack") == 1
    assert lines[-2] == message and lines[-1].startswith("the trainer exited with code 3")
    resumed = events[:2] + [{"event": "run_start", "time": 4.0}, {"event": "run_end", "time": 5.0, "status": "failed",
                                                                   "error": "verl's trainer exited 1", "steps": 7}]
    lines.clear()
    finish(st, 1, resumed, out, lines.append, True, lambda: pytest.fail("--keep"), "the stack")
    assert message not in lines  # an earlier attempt's stop is not this attempt's cause


def test_which_of_several_died_is_said_and_recorded(tmp_path):
    follow, _ = scripted_follow([RoleDied("trainer", KILLED, 6, where="on spark2 (machine 1 of 2)"), 0])
    lines, st = [], state(tmp_path)
    assert supervise(st, lines.append, 100.0, 1, follow, lambda role: 0.0) == 0
    assert lines[0].startswith("the trainer on spark2 (machine 1 of 2) exited with code 137")
    assert [e.get("where") for e in st.deploy_events() if e["event"] == "role_died"] == ["on spark2 (machine 1 of 2)"]
