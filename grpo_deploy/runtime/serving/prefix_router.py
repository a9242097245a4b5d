"""Which replica likely holds a prompt's KV cache: prompt blocks hashed in a chain seeded with the model (adapter)
name, who served each block, and the choice of a replica (hit, miss or spill). Pure: no I/O; the replica proxy
(replica_proxy.py) asks it."""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import Counter, OrderedDict

# A text prompt has no token ids: blocks of this many characters per token stand in for token blocks.
CHARS_PER_TOKEN = 4


class _Block:
    __slots__ = ("owners", "successors")

    def __init__(self):
        self.owners: dict[int, int] = {}  # replica -> its epoch when it served this block
        self.successors: set[bytes] = set()  # at most 2 kept: 2 means "shared by different prompts"


class PrefixRouter:
    """Which replica likely holds a prompt's KV: whole blocks of `block_size` tokens hashed in a chain seeded with the
    model (adapter) name. A block is common, and resets the count, when different prompts continue it (it and its
    ancestors are a shared template) or every replica served it; the replica with the most blocks after the last
    common one wins, unless it has more than `imbalance` requests in flight beyond the least loaded (a spill)."""

    def __init__(self, replicas: int, block_size: int = 16, imbalance: int = 8, max_blocks: int = 500_000):
        self.replicas, self.block_size, self.imbalance, self.max_blocks = replicas, block_size, imbalance, max_blocks
        self.epochs = [0] * replicas
        self.index: OrderedDict[bytes, _Block] = OrderedDict()
        self._turn = 0

    def hashes(self, model: str, prompt: object) -> list[bytes]:
        """The chained block hashes of *prompt* (token ids, or text as a stand-in) under *model*'s namespace."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]  # a batch: routed by its first prompt
        if isinstance(prompt, list):
            try:
                data, width = array("q", prompt).tobytes(), 8 * self.block_size
            except (TypeError, OverflowError):
                prompt = json.dumps(prompt)
        if isinstance(prompt, str):
            data, width = prompt.encode(), CHARS_PER_TOKEN * self.block_size
        elif not isinstance(prompt, list):
            return []
        chain = hashlib.blake2b(model.encode(), digest_size=16, person=b"grpo-proxy").digest()
        out = []
        for start in range(0, len(data) - width + 1, width):
            chain = hashlib.blake2b(chain + data[start : start + width], digest_size=16).digest()
            out.append(chain)
        return out

    def _holders(self, block: _Block) -> list[int]:
        return [r for r, epoch in block.owners.items() if self.epochs[r] == epoch]

    def scores(self, hashes: list[bytes]) -> Counter:
        """Matching blocks per replica after the last common block."""
        score: Counter = Counter()
        for h in hashes:
            block = self.index.get(h)
            if block is None:
                break  # a chain: nothing after a miss can match
            holders = self._holders(block)
            if len(block.successors) > 1 or (self.replicas > 1 and len(holders) == self.replicas):
                score.clear()
                continue
            score.update(holders)
        return score

    def least_loaded(self, loads: dict[int, int]) -> int:
        low = min(loads.values())
        tied = sorted(r for r, n in loads.items() if n == low)
        self._turn += 1
        return tied[self._turn % len(tied)]

    def choose(self, hashes: list[bytes], loads: dict[int, int]) -> tuple[int, str]:
        """(replica, "hit" | "miss" | "spill") among *loads* (eligible replica -> requests in flight)."""
        score = {r: n for r, n in self.scores(hashes).items() if r in loads and n > 0}
        least = self.least_loaded(loads)
        if not score:
            return least, "miss"
        top = max(score.values())
        best = min((r for r, n in score.items() if n == top), key=lambda r: (loads[r], r))
        if loads[best] - loads[least] > self.imbalance:
            return least, "spill"
        return best, "hit"

    def record(self, hashes: list[bytes], replica: int) -> None:
        """*replica* now holds these blocks (vLLM caches whole blocks of the prompt it served)."""
        previous = None
        for h in hashes:
            block = self.index.get(h)
            if block is None:
                block = self.index[h] = _Block()
            else:
                self.index.move_to_end(h)
            block.owners[replica] = self.epochs[replica]
            if previous is not None and len(previous.successors) < 2:
                previous.successors.add(h)
            previous = block
        while len(self.index) > self.max_blocks:
            self.index.popitem(last=False)

    def forget_replica(self, replica: int) -> None:
        """The replica's cache is gone (it went down): the blocks it served no longer count for it."""
        self.epochs[replica] += 1

    def clear(self) -> None:
        self.index.clear()


def prompt_of(path: str, payload: object) -> tuple[str, object]:
    """(model, prompt) of a completion request; a chat's messages become text, one message after another."""
    if not isinstance(payload, dict):
        return "", None
    model = str(payload.get("model") or "")
    if path.endswith("/chat/completions"):
        messages = payload.get("messages")
        if not isinstance(messages, list):
            return model, None
        return model, "".join(json.dumps(m, sort_keys=True, separators=(",", ":")) for m in messages)
    return model, payload.get("prompt")
