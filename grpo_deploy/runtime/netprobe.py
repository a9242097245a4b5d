"""Can the hosts of a Ray cluster reach each other on Ray's ports, before Ray starts? Runs inside the verl image on
each host's network (one-off containers of preflight): `listen` holds the node's ports open on its address for a
while; `connect` tries every other node's ports and prints one JSON line: {target: "ok" | why not}. A target that
refuses is tried again until the deadline (its listener may still be starting); one that does not answer at all is
what a firewall dropping the port looks like."""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import sys
import time

CONNECT_TIMEOUT_S = 3.0


def listen(ip: str, ports: list[int], seconds: float) -> int:
    """Accept (and close) connections on ip:port for each port until *seconds* passed; exit 1 at once when a port
    cannot be bound (in use, or not an address of this host)."""
    sel = selectors.DefaultSelector()
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError as exc:
            print(json.dumps({"listening": False, "port": port, "error": exc.strerror or str(exc)}), flush=True)
            return 1
        sock.listen(16)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
    print(json.dumps({"listening": True, "ip": ip, "ports": ports}), flush=True)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        for key, _ in sel.select(timeout=min(left, 1.0)):
            conn, _addr = key.fileobj.accept()
            conn.close()
    return 0


def try_connect(target: str, deadline: float, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """"ok", or why *target* (ip:port) could not be reached by *deadline*."""
    host, _, port = target.rpartition(":")
    why = "not tried"
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return "ok"
        except TimeoutError:
            why = f"no answer within {timeout:g} s (a firewall dropping the port?)"
        except ConnectionRefusedError:
            why = "connection refused (nothing listens there, or a firewall rejects it)"
        except OSError as exc:
            why = exc.strerror or str(exc)
        if time.monotonic() + 0.5 >= deadline:
            return why
        time.sleep(0.5)


def connect(targets: list[str], seconds: float) -> int:
    deadline = time.monotonic() + seconds
    result = {t: try_connect(t, deadline) for t in targets}
    print(json.dumps(result), flush=True)
    return 0 if all(v == "ok" for v in result.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.netprobe", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    lp = sub.add_parser("listen", help="hold ports open on an address")
    lp.add_argument("--ip", required=True)
    lp.add_argument("--ports", required=True, help="comma-separated")
    lp.add_argument("--seconds", type=float, default=60.0)
    cp = sub.add_parser("connect", help="try ip:port targets, print {target: result} as JSON")
    cp.add_argument("--targets", required=True, help="comma-separated ip:port")
    cp.add_argument("--seconds", type=float, default=12.0)
    args = parser.parse_args(argv)
    if args.verb == "listen":
        return listen(args.ip, [int(p) for p in args.ports.split(",")], args.seconds)
    return connect([t for t in args.targets.split(",") if t], args.seconds)


if __name__ == "__main__":
    sys.exit(main())
