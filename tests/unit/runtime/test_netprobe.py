"""grpo_deploy.runtime.netprobe over loopback: a listener holds ports open, a connect reaches them; a port nobody
listens on is refused (retried until the deadline), one taken cannot be listened on."""

from __future__ import annotations

import json
import socket
import threading
import time

from grpo_deploy.runtime import netprobe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_listen_then_connect_over_loopback(capsys):
    ports = [free_port(), free_port()]
    listener = threading.Thread(target=netprobe.listen, args=("127.0.0.1", ports, 3.0), daemon=True)
    listener.start()
    time.sleep(0.3)
    targets = [f"127.0.0.1:{p}" for p in ports]
    assert netprobe.connect(targets, seconds=2) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["listening"] is True and lines[-1] == {t: "ok" for t in targets}
    listener.join(timeout=5)


def test_a_port_nobody_listens_on_is_refused_after_retrying():
    start = time.monotonic()
    why = netprobe.try_connect(f"127.0.0.1:{free_port()}", deadline=time.monotonic() + 1.2)
    assert "refused" in why and time.monotonic() - start >= 1.0


def test_a_taken_port_cannot_be_listened_on(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert netprobe.listen("127.0.0.1", [taken.getsockname()[1]], 1.0) == 1
    said = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert said["listening"] is False and said["error"]
