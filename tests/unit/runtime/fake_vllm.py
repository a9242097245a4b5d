"""A fake vLLM server on aiohttp (127.0.0.1, an ephemeral port) for the replica proxy's tests: the endpoints TRL's
async GRPO calls, adapters that must be loaded before a completion may name them (vLLM's 404 otherwise), loads that
can answer "No adapter found" for a while or be refused, completions that can be held in flight, and a log."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

BASE = "tiny-qwen2"


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class FakeVLLM:
    """`calls` holds (method, path with query, json body) in arrival order; `lag` answers that many loads with vLLM's
    "No adapter found" first; `refuse` answers every load with (status, message); `hold` keeps completions in flight
    until it is set; a streamed completion waits on `gate` after its first event; `healthy` False makes /health
    answer 503; `runtime_lora` False drops the LoRA routes (FastAPI's plain 404)."""

    def __init__(self, port: int = 0):
        self.port = port
        self.calls: list[tuple[str, str, object]] = []
        self.adapters: dict[str, str] = {}
        self.lag = 0
        self.refuse: tuple[int, str] | None = None
        self.hold: asyncio.Event | None = None
        self.healthy = True
        self.runtime_lora = True
        self.paused = False
        self.gate: asyncio.Event | None = None
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self, method: str = "POST") -> list[str]:
        return [path for m, path, _ in self.calls if m == method]

    def completions(self) -> list[dict]:
        return [body for m, path, body in self.calls if path.startswith("/v1/") and path.endswith("completions")]

    async def start(self) -> FakeVLLM:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.calls.append((request.method, request.path_qs, body))
        if raw and request.content_type not in ("", "application/json"):  # FastAPI then sees no JSON body
            return web.json_response({"detail": [{"type": "missing", "loc": ["body"]}]}, status=422)
        path = request.path
        if path == "/health":
            return web.Response(status=200 if self.healthy else 503)
        if path == "/v1/models":
            data = [{"id": BASE, "max_model_len": 512}] + [{"id": n, "root": p} for n, p in self.adapters.items()]
            return web.json_response({"object": "list", "data": data})
        if path in ("/v1/completions", "/v1/chat/completions"):
            return await self._complete(body, request)
        if path in ("/pause", "/resume", "/reset_prefix_cache"):
            self.paused = path == "/pause" or (self.paused and path != "/resume")
            return web.json_response({"status": "ok"})
        if path == "/server_info":
            return web.json_response({"vllm_config": {"parallel_config": {"data_parallel_size": 1}}})
        if path == "/get_world_size":
            return web.json_response({"world_size": 1})
        if path == "/v1/load_lora_adapter" and self.runtime_lora:
            return self._load(body)
        if path == "/v1/unload_lora_adapter" and self.runtime_lora:
            if self.adapters.pop(body["lora_name"], None) is None:
                return _error(404, f"The lora adapter '{body['lora_name']}' cannot be found.", "NotFoundError")
            return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")
        return web.json_response({"detail": "Not Found"}, status=404)

    def _load(self, body: dict) -> web.Response:
        name, path = body["lora_name"], body["lora_path"]
        if self.lag > 0:
            self.lag -= 1
            return _error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        if self.refuse is not None:
            return _error(self.refuse[0], self.refuse[1], "BadRequestError")
        if name in self.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
        self.adapters[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _complete(self, body: dict, request: web.Request) -> web.StreamResponse:
        model = body.get("model")
        if model != BASE and model not in self.adapters:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        if self.hold is not None:
            await self.hold.wait()
        if body.get("stream"):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for text in ("o", "k"):
                if text == "k" and self.gate is not None:
                    await self.gate.wait()  # the first event must reach the client before the rest is written
                await out.write(
                    f"data: {json.dumps({'choices': [{'text': text}], 'served_by': self.port})}\n\n".encode()
                )
            await out.write(b"data: [DONE]\n\n")
            await out.write_eof()
            return out
        return web.json_response(
            {
                "id": "cmpl-fake",
                "model": model,
                "served_by": self.port,
                "choices": [
                    {"index": 0, "text": "ok", "token_ids": [7, 8], "logprobs": {"token_logprobs": [-0.1, -0.2]}}
                ],
            }
        )
