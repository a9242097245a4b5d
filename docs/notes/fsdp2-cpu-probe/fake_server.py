"""Just enough of vLLM's HTTP API for AsyncGRPOTrainer's LoRA-sync path (rollouts come from a stub worker)."""
import json, sys
from aiohttp import web
LOG = open("/work/fake_server.log", "a")
async def handle(request):
    raw = await request.read()
    print(request.method, request.path_qs, raw[:200], file=LOG, flush=True)
    p = request.path
    if p == "/health": return web.Response(status=200)
    if p == "/v1/models": return web.json_response({"data": [{"id": "tiny-qwen2", "max_model_len": 512}]})
    if p == "/server_info":
        return web.json_response({"vllm_config": {"lora_config": {"max_lora_rank": 8, "max_loras": 8},
                                                  "parallel_config": {"data_parallel_size": 1}},
                                  "lora_config": {"max_lora_rank": 8, "max_loras": 8},
                                  "parallel_config": {"data_parallel_size": 1}})
    if p in ("/pause", "/resume", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"): return web.Response(text="Success")
    return web.json_response({"detail": "Not Found"}, status=404)
app = web.Application(); app.router.add_route("*", "/{tail:.*}", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
