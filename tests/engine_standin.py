"""A stand-in Docker engine for unit tests (named so: a real engine cannot be made this busy on demand): an HTTP
server on a unix socket that answers the few API paths the tests use, and stalls the paths it is told to stall for
longer than the client waits — as a 2-core engine committing a 4 GB layer did. The real Docker SDK talks to it."""

from __future__ import annotations

import json
import re
import socketserver
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler
from pathlib import Path

IMAGE_ID = "sha256:" + "ab" * 32


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True


class StandInEngine:
    """`with StandInEngine(tmp_path, stall={"POST /images/prune": 5}) as engine: engine.url, engine.calls`."""

    def __init__(self, folder: Path, stall: dict[str, float] | None = None, stall_times: int = 10**6,
                 tags: list[str] | None = None):
        self.path = folder / "engine.sock"
        self.stall = stall or {}
        self.stall_times = stall_times  # how many requests of a stalled route stall (the rest answer at once)
        self.tags = tags or []
        self.calls: Counter[str] = Counter()
        self.release = threading.Event()  # set at exit: stalled handlers return and the server can stop
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def address_string(self):
                return "standin"

            def _answer(self, body, status=200, content_type="application/json"):
                if isinstance(body, list) and body and isinstance(body[0], bytes):  # a stream: chunked, as the engine
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in [*body, b""]:
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    return
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                elif self.headers.get("Transfer-Encoding") == "chunked":
                    while (size := int(self.rfile.readline().strip() or b"0", 16)) > 0:
                        self.rfile.read(size + 2)
                    self.rfile.readline()
                path = re.sub(r"^/v[0-9.]+", "", self.path.split("?", 1)[0])
                route = f"{method} {path}"
                standin.calls[route] += 1
                delay = standin.stall.get(route)
                if delay and standin.calls[route] <= standin.stall_times:
                    standin.release.wait(delay)
                    if standin.release.is_set():
                        return
                self._answer(*standin.answer(route))

            def do_GET(self):
                self._route("GET")

            def do_HEAD(self):
                self._route("HEAD")

            def do_POST(self):
                self._route("POST")

            def do_DELETE(self):
                self._route("DELETE")

        self._server = _Server(str(self.path), Handler)

    def answer(self, route: str) -> tuple:
        method, path = route.split(" ", 1)
        if path == "/_ping":
            return (b"OK", 200, "text/plain")
        if path == "/version":
            return ({"ApiVersion": "1.41", "Version": "20.10.24"},)
        if route == "POST /build":
            lines = [{"stream": "Step 1/1 : FROM scratch\n"}, {"aux": {"ID": IMAGE_ID}},
                     {"stream": f"Successfully built {IMAGE_ID[7:19]}\n"}]
            return ([json.dumps(line).encode() + b"\r\n" for line in lines], 200)
        if route == "POST /images/prune":
            return ({"ImagesDeleted": None, "SpaceReclaimed": 0},)
        if route == "GET /images/json":
            return ([],)
        if method == "GET" and path.startswith("/images/") and path.endswith("/json"):
            return ({"Id": IMAGE_ID, "RepoTags": self.tags, "Size": 4_300_000_000},)
        if method == "POST" and path.startswith("/images/") and path.endswith("/tag"):
            return (b"", 201, "text/plain")
        return ({"message": f"stand-in engine: no route {route}"}, 404)

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def __enter__(self) -> StandInEngine:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        time.sleep(0.05)
        self._server.shutdown()
        self._server.server_close()
