"""The replica proxy's door: the run's token asked of every request (`unauthorized`), the endpoints it passes on
(each one method and one path, with the TRL 1.16 and kit code that calls it), the one-line refusal of everything
else, and the checks of an adapter load or unload before any replica sees it: a bounded JSON body, a name of the
kit's form, a path that is the adapter's own folder in the run's adapter folder with no link out of it. The proxy
(proxy.py) asks it; nothing here talks to a replica."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import stat
from dataclasses import dataclass

from aiohttp import web

from grpo_deploy.common.shown import shown, shown_key
from grpo_deploy.runtime import run_token
from grpo_deploy.runtime.serving.http import Answer, error_answer
from grpo_deploy.runtime.storage.adapters import VERSION_PATTERN

log = logging.getLogger("grpo_deploy.replica_proxy")

MODELS, STATS = "/v1/models", "/proxy/stats"
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
BODY_LIMIT = 64 * 1024  # an adapter load or unload: TRL's is under 200 bytes
NAME_LIMIT = 32  # "trl-policy-v" and up to 20 digits
PATH_LIMIT = 4096  # PATH_MAX
ENTRIES_LIMIT = 1000  # files and folders looked at in one adapter folder (TRL writes 3)
DISK_TIMEOUT_S = 30.0  # the link check reads the share: a share that hangs is a 504, not a stuck proxy


@dataclass(frozen=True)
class Endpoint:
    """One request the proxy passes on: its method and path, what the proxy does with it (`how`: routed, models,
    health, stats, one, broadcast, load, unload, merged) and who calls it (TRL 1.16's trl/experimental/async_grpo/
    files and functions, and the kit's)."""

    method: str
    path: str
    how: str
    callers: str


# Read from trl 1.16.0: experimental/async_grpo/vllm_client.py (VLLMClient, the trainer's one HTTP client),
# async_grpo_trainer.py (AsyncGRPOTrainer), async_rollout_worker.py (AsyncRolloutWorker, generation over aiohttp)
# and weight_transfer.py (WeightTransferClient, the merged NCCL sync); and from the kit's own callers.
ENDPOINTS = {
    e.path: e
    for e in (
        Endpoint("GET", "/health", "health",
                 "VLLMClient.wait_for_server_ready (AsyncGRPOTrainer._init_lora_sync and get_train_dataloader, "
                 "WeightTransferClient.init_weight_transfer)"),
        Endpoint("GET", "/server_info", "one",
                 "VLLMClient.get_server_info (AsyncGRPOTrainer._init_lora_sync: select_adapter_sync), "
                 "VLLMClient.get_dtype (WeightTransferClient.init_weight_transfer)"),
        Endpoint("GET", MODELS, "models",
                 "VLLMClient.get_max_model_len (AsyncGRPOTrainer.get_train_dataloader); kit: "
                 "runtime/storage/adapters.py loaded_adapters (unload_stale), runtime/health.py server_healthy "
                 "(the proxy's compose health check, the bring-up's readiness)"),
        Endpoint("GET", "/get_world_size", "one",
                 "VLLMClient.get_world_size (WeightTransferClient.init_weight_transfer, merged sync: refused next)"),
        Endpoint("POST", "/v1/completions", "routed",
                 "AsyncRolloutWorker._generate_one_turn (its _post); kit: runtime/health.py first_token, "
                 "runtime/trainer/trl_hooks.py InstrumentedVLLMClient._warm_up"),
        Endpoint("POST", "/pause", "broadcast",
                 "VLLMClient.pause (AsyncGRPOTrainer._sync_weight_lora, WeightTransferClient.pause)"),
        Endpoint("POST", "/resume", "broadcast",
                 "VLLMClient.resume (AsyncGRPOTrainer._sync_weight_lora, WeightTransferClient.resume); kit: "
                 "runtime/storage/adapters.py resume_server (runtime/trainer/train.py)"),
        Endpoint("POST", LOAD, "load",
                 "VLLMClient.load_lora_adapter (AsyncGRPOTrainer._sync_weight_lora; the kit's "
                 "runtime/trainer/trl_hooks.py InstrumentedVLLMClient wraps it)"),
        Endpoint("POST", UNLOAD, "unload",
                 "VLLMClient.unload_lora_adapter (AsyncGRPOTrainer._sync_weight_lora); kit: "
                 "runtime/storage/adapters.py unload_stale"),
        Endpoint("GET", STATS, "stats",
                 "the proxy's own; kit: tests/faults/test_replica_kill.py, tests/integration/"
                 "test_replicas_hosts.py, benchmarks/proxy_overhead.py"),
        # TRL's merged (NCCL) sync sizes its group from one server and would reach one replica: answered 501 with
        # the reason, never forwarded.
        *(Endpoint("POST", path, "merged", f"VLLMClient.{path[1:]} (WeightTransferClient, merged sync)")
          for path in ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                       "/finish_weight_update")),
    )
}
ALLOWED = ", ".join(f"{e.method} {e.path}" for e in ENDPOINTS.values() if e.how != "merged")


def unauthorized(request: web.Request, token: str) -> Answer | None:
    """None when the proxy has no token (a front on loopback) or the request carries exactly one `Authorization: Bearer
    <token>` (compared in constant time); else 401 in one line that names the header, never what came in it. Asked
    before anything else: who lacks the token learns nothing of what is passed on."""
    if not token or run_token.matches(request.headers.getall("Authorization", []), token):
        return None
    answer = error_answer(401, "the run's token is missing or wrong: the proxy passes nothing on without "
                               "`Authorization: Bearer <the run's token>` (GRPO_RUN_TOKEN)", "Unauthorized")
    answer.headers["WWW-Authenticate"] = 'Bearer realm="grpo-deploy"'
    return answer


def admit(method: str, path: str) -> Endpoint | Answer:
    """The endpoint a request is for, or its refusal: 404 for a path not in ENDPOINTS, 405 for another method."""
    endpoint = ENDPOINTS.get(path)
    if endpoint is None:
        return error_answer(404, f"{shown(path)} is not passed on by the replica proxy: it passes on only what TRL "
                                 f"1.16's async GRPO and the kit call ({ALLOWED})", "NotFoundError")
    if method != endpoint.method:
        answer = error_answer(405, f"{shown(method)} {path}: the replica proxy takes only {endpoint.method} there",
                              "MethodNotAllowed")
        answer.headers["Allow"] = endpoint.method
        return answer
    return endpoint


def target(endpoint: Endpoint, request: web.Request) -> str:
    """What is asked of a replica: the allowed path itself (never the path as it came) and the query as it came."""
    query = request.rel_url.raw_query_string
    return endpoint.path + (f"?{query}" if query else "")


# ---------------------------------------------------------------- adapter loads and unloads


@dataclass(frozen=True)
class Adapter:
    """A checked load or unload: the adapter's name, the body the replicas get (the checked object written again,
    so they parse what was checked) and the headers passed on (Authorization only, vLLM's --api-key; the proxy's
    one call to a replica says the body is JSON)."""

    name: str
    body: bytes
    headers: dict[str, str]


async def checked_adapter(request: web.Request, endpoint: Endpoint, folder: str) -> Adapter | Answer:
    """A load's or an unload's body checked (see the module's docstring), or the one-line refusal (400, 403, 413;
    504 when the share does not answer the link check). *folder* is the run's adapter folder (--adapter-dir)."""
    raw = await _bounded(request)
    if raw is None:
        return _refused(413, f"body over {BODY_LIMIT // 1024} KiB")
    payload = _json_object(raw)
    if isinstance(payload, Answer):
        return payload
    keys = {"lora_name": str, "lora_path": str, "load_inplace": bool} if endpoint.how == "load" else {"lora_name": str}
    required = ("lora_name", "lora_path") if endpoint.how == "load" else ("lora_name",)
    for key, value in payload.items():
        if key not in keys:
            return _refused(400, f"unknown key {shown_key(key)} (takes {', '.join(keys)})")
        if not isinstance(value, keys[key]):
            return _refused(400, f"{key} must be a {'string' if keys[key] is str else 'boolean'}, got {shown(value)}")
    missing = [key for key in required if key not in payload]
    if missing:
        return _refused(400, f"{' and '.join(missing)} missing")
    name = payload["lora_name"]
    if len(name) > NAME_LIMIT or not VERSION_PATTERN.fullmatch(name):
        return _refused(400, f"lora_name {shown(name)} is not an adapter name of the kit (trl-policy-vN)")
    if endpoint.how == "load":
        refused = await _path_refused(payload["lora_path"], folder, name)
        if refused is not None:
            return refused
    auth = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
    return Adapter(name, json.dumps(payload).encode(), auth)


async def _bounded(request: web.Request) -> bytes | None:
    """The request's body, or None when it is over BODY_LIMIT (from its Content-Length, else read up to one byte
    over)."""
    if request.content_length is not None and request.content_length > BODY_LIMIT:
        return None
    chunks, size = [], 0
    while chunk := await request.content.read(BODY_LIMIT + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > BODY_LIMIT:
            return None
    return b"".join(chunks)


def _json_object(raw: bytes) -> dict | Answer:
    """The body as a JSON object: UTF-8, no duplicate keys, no NaN or Infinity; else 400 `body is not JSON`."""

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate key")
        return dict(pairs)

    def no_constant(name):
        raise ValueError(name)

    try:
        payload = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return _refused(400, "body is not JSON (a JSON object, UTF-8, each key once)")
    if not isinstance(payload, dict):
        return _refused(400, f"body is not a JSON object: {shown(payload)}")
    return payload


async def _path_refused(path: str, folder: str, name: str) -> Answer | None:
    """None when *path* is `<folder>/<name>` as TRL writes it (absolute, normalised) and, where the proxy sees the
    share, a folder itself (no link) with no link inside that leads out of *folder*; else the refusal."""
    if not folder:
        return _refused(403, "the proxy was started without --adapter-dir: it passes on no adapter load")
    if len(path) > PATH_LIMIT or not path.isprintable():
        return _refused(400, f"lora_path {shown(path)} holds an unprintable character or is over {PATH_LIMIT}")
    if not path.startswith("/") or path.startswith("//") or posixpath.normpath(path) != path:
        return _refused(400, f"lora_path {shown(path)} is not an absolute, normalised path (no .., //, ./)")
    own = posixpath.join(folder, name)
    if path != own:
        inside = path.startswith(folder + "/")
        return _refused(403, f"lora_path {shown(path)} is not {own} (the adapter's own folder in the run's adapter "
                             f"folder{'' if inside else f', and lies outside {folder}'})")
    try:
        seen, why = await asyncio.wait_for(asyncio.to_thread(links_out, path, folder), DISK_TIMEOUT_S)
    except TimeoutError:
        return error_answer(504, f"adapter load: the share did not answer within {DISK_TIMEOUT_S:g} s while the "
                                 f"proxy looked at {path}", "GatewayTimeout")
    if not seen:
        log.warning(f"adapter load {name}: the proxy cannot see {path} (no share here, or not written yet): "
                    "checked as a path only, not for links")
    return None if why is None else _refused(403, f"lora_path {path} {why}")


def links_out(path: str, folder: str) -> tuple[bool, str | None]:
    """Whether the proxy sees the adapter folder *path* (inside the run's adapter folder *folder*) on the share, and
    why it is refused there, or None: it is a link, or not a folder, or holds a link (at any depth, up to
    ENTRIES_LIMIT entries) resolving outside *folder*. Not seen (no share here, or not written yet): the path's
    string was all the proxy could check, and a replica that cannot see it either answers so."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False, None
    except OSError as error:
        return True, f"cannot be looked at by the proxy ({error.strerror})"
    if stat.S_ISLNK(mode):
        return True, "is a link (TRL writes a folder there)"
    if not stat.S_ISDIR(mode):
        return True, "is not a folder"
    real = os.path.realpath(folder)
    if os.path.realpath(path) != os.path.join(real, os.path.basename(path)):
        return True, f"resolves outside {folder}"
    try:
        return True, _inner_link_out(path, real)
    except OSError as error:
        return True, f"cannot be looked at by the proxy ({error.strerror})"


def _inner_link_out(path: str, real: str) -> str | None:
    """The first link below *path* that resolves outside the folder *real*, as a reason, or None."""
    seen, todo = 0, [path]
    while todo:
        with os.scandir(todo.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > ENTRIES_LIMIT:
                    return f"holds more than {ENTRIES_LIMIT} files and folders"
                if entry.is_symlink():
                    if os.path.commonpath([os.path.realpath(entry.path), real]) != real:
                        return f"holds a link out of the adapter folder: {shown(os.path.relpath(entry.path, path))}"
                elif entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
    return None


def _refused(status: int, reason: str) -> Answer:
    kind = {400: "BadRequestError", 403: "Forbidden", 413: "PayloadTooLarge"}[status]
    return error_answer(status, f"adapter request refused by the replica proxy: {reason}", kind)
