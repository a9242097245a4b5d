"""launch.EnginePatience: a slow Docker engine is ridden out, a silent one ends `up` in one line, real errors pass."""

import socket
import threading
import time

import docker
import pytest

from grpo_deploy.launch import EnginePatience, LaunchError


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
