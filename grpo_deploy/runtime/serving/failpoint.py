"""The replica proxy's fault-suite hook `serve-base-model`, inert unless its file exists: the run's checkpoint folder
(the parent of the proxy's --adapter-dir, on the share the proxy mounts at the trainer's path) holds
`.failpoints/serve-base-model`, as the trainer's failpoints do (runtime/trainer/trl_hooks.py install_failpoints).
tests/faults creates it; nothing in the kit does.

While the file exists the proxy plays a server that keeps serving the base model: adapter loads and unloads are
answered 200 without reaching a replica; a completion naming a `trl-policy-*` adapter is served by the base model (its
`model` rewritten to the base's served name, learnt from a replica's model list); GET /v1/models lists the swallowed
adapters as loaded, unless the file says `unlisted` (then it shows the replicas' truth). Removing the file ends it for
new requests; swallowed adapters stay unloaded.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import time

from grpo_deploy.runtime.serving import model_list
from grpo_deploy.runtime.serving.http import Answer
from grpo_deploy.runtime.storage.adapters import POLICY_PREFIX

log = logging.getLogger("grpo_deploy.replica_proxy")

FAILPOINT_DIR = ".failpoints"  # the fault suite's folder in the checkpoint folder (the trainer's failpoints too)
SERVE_BASE_MODEL = "serve-base-model"
LOOK_EVERY_S = 1.0  # the file is looked for at most once a second (a stat on the share per completion is too many)
READ_LIMIT = 64


def failpoint_path(adapter_dir: str) -> str | None:
    """Where the proxy looks for the failpoint file, or None without an adapter folder (then it is never armed)."""
    if not adapter_dir:
        return None
    return posixpath.join(posixpath.dirname(posixpath.normpath(adapter_dir)), FAILPOINT_DIR, SERVE_BASE_MODEL)


class ServeBaseModel:
    """The failpoint's state: whether it is armed (looked up at most every LOOK_EVERY_S), its mode, and the adapter
    names whose loads it swallowed."""

    def __init__(self, adapter_dir: str, clock=time.monotonic):
        self.path, self.clock = failpoint_path(adapter_dir), clock
        self.swallowed: dict[str, None] = {}  # in load order
        self.listed = True
        self._armed, self._looked = False, None

    def armed(self) -> bool:
        if self.path is None:
            return False
        now = self.clock()
        if self._looked is not None and now - self._looked < LOOK_EVERY_S:
            return self._armed
        self._looked = now
        was, self._armed = self._armed, False
        try:
            if os.path.isfile(self.path) and not os.path.islink(self.path):
                with open(self.path, "rb") as handle:
                    text = handle.read(READ_LIMIT).decode("ascii", errors="replace").strip()
                self._armed, self.listed = True, text != "unlisted"
        except OSError as error:
            log.warning(f"failpoint {self.path} ignored: {error}")
        if self._armed != was:
            log.warning(f"failpoint {SERVE_BASE_MODEL} {'armed' if self._armed else 'disarmed'}: adapter loads "
                        f"{'acknowledged without reaching a replica' if self._armed else 'reach the replicas again'}")
        return self._armed

    def load(self, name: str) -> Answer:
        self.swallowed.pop(name, None)
        self.swallowed[name] = None
        log.warning(f"failpoint {SERVE_BASE_MODEL}: load of {name} acknowledged, not passed on")
        return Answer(200, f"Success: LoRA adapter '{name}' added successfully.".encode(), "text/plain")

    def unload(self, name: str) -> Answer:
        self.swallowed.pop(name, None)
        log.warning(f"failpoint {SERVE_BASE_MODEL}: unload of {name} acknowledged, not passed on")
        return Answer(200, f"Success: LoRA adapter '{name}' removed successfully.".encode(), "text/plain")

    @staticmethod
    def rewritten(body: bytes, base: str | None) -> bytes:
        """A completion's body with a `trl-policy-*` model named *base* instead (anything else as it came)."""
        if base is None:
            return body
        try:
            payload = json.loads(body)
        except ValueError:
            return body
        if not isinstance(payload, dict) or not str(payload.get("model") or "").startswith(POLICY_PREFIX):
            return body
        return json.dumps({**payload, "model": base}).encode()

    def models(self, answer: Answer, base: str | None) -> Answer:
        """The merged model list with the swallowed adapters listed as loaded (when `listed`)."""
        if not self.listed or answer.status != 200 or not self.swallowed:
            return answer
        try:
            listing = json.loads(answer.body)
            data = listing["data"]
        except (ValueError, KeyError, TypeError):
            return answer
        have = {entry.get("id") for entry in data if isinstance(entry, dict)}
        data += [{"id": name, "object": "model", "owned_by": "vllm", "root": name, "parent": base}
                 for name in self.swallowed if name not in have]
        return Answer(200, json.dumps(listing).encode(), "application/json")


def base_name(answer: Answer | None) -> str | None:
    """The base model's served name in a replica's GET /v1/models answer: the one entry that is no adapter."""
    if answer is None or answer.status != 200:
        return None
    try:
        models = model_list.entries(json.loads(answer.body))
    except (ValueError, RecursionError):
        return None
    return model_list.base_of(models) if models is not None else None
