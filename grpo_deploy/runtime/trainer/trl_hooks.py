"""Every runtime rebinding of a TRL 1.16 async-GRPO name (TRL's files are never edited), in one place for upgrades."""

from __future__ import annotations

import logging
import os
import threading
import time

from trl.experimental.async_grpo import async_grpo_trainer as trainer_module
from trl.experimental.async_grpo import async_rollout_worker as rollout_module
from trl.experimental.async_grpo import vllm_client as client_module

from grpo_deploy.runtime import run_token
from grpo_deploy.runtime.serving import failpoint
from grpo_deploy.runtime.storage import faults as storage_faults
from grpo_deploy.runtime.storage.adapters import AdapterPublisher

log = logging.getLogger(__name__)


def _no_peak_flops(accelerator, dtype) -> None:
    """MFU is undefined on CPU; TRL's lookup asks CUDA for the device name and asserts without it."""
    return None


def neutralise_peak_flops() -> None:
    """Rebind the name the trainer module imported, so `AsyncGRPOTrainer.__init__` gets None (MFU metrics off)."""
    trainer_module.get_peak_flops_per_device = _no_peak_flops


# ---------------------------------------------------------------- the run's token on every call to the server


class _TokenRequests:
    """Stands in for the `requests` module inside TRL's client (vllm_client.py calls `requests.get/post` and nothing
    else): every call carries the run's token (the kit's front answers 401 without it), a header given by TRL kept."""

    def __init__(self, requests_module, headers: dict[str, str]):
        self.requests = requests_module
        self._headers = headers

    def _with_token(self, kwargs: dict) -> dict:
        return {**kwargs, "headers": {**self._headers, **(kwargs.get("headers") or {})}}

    def get(self, *args, **kwargs):
        return self.requests.get(*args, **self._with_token(kwargs))

    def post(self, *args, **kwargs):
        return self.requests.post(*args, **self._with_token(kwargs))

    def request(self, *args, **kwargs):
        return self.requests.request(*args, **self._with_token(kwargs))

    def __getattr__(self, name):
        return getattr(self.requests, name)


class TokenRolloutLoop(rollout_module._AsyncRolloutLoop):
    """TRL's rollout loop, which runs in a spawned child (AsyncRolloutWorker._loop_cls, pickled by reference), with
    the run's token from the child's environment (inherited) as a default header of the aiohttp session it opens for
    its generation calls."""

    @property
    def session(self):
        return self.__dict__.get("_token_session")

    @session.setter
    def session(self, value) -> None:
        if value is not None:
            value.headers.update(run_token.env_headers())
        self.__dict__["_token_session"] = value


def send_run_token() -> bool:
    """TRL's HTTP client (its `requests` name) sends the run's token from this process's environment (GRPO_RUN_TOKEN)
    on every call; call it before the trainer is built (its __init__ already asks the server). False, and nothing
    rebound, when there is no token (a server on loopback, no front). A malformed token raises RunTokenError."""
    token = run_token.of_environ()
    if token is None:
        return False
    if not isinstance(client_module.requests, _TokenRequests):
        client_module.requests = _TokenRequests(client_module.requests, run_token.headers(token))
    return True


def token_for_rollouts(trainer) -> None:
    """The trainer's rollout worker (TRL's own AsyncRolloutWorker) opens its generation session with the run's token:
    its child runs TokenRolloutLoop. Before `train()` (the worker's child starts on train begin)."""
    worker = getattr(trainer, "rollout_worker", None)
    if isinstance(worker, rollout_module.AsyncRolloutWorker) and run_token.env_headers():
        worker._loop_cls = TokenRolloutLoop


# ---------------------------------------------------------------- adapter loads

# TRL 1.16's rollout worker holds up to this many generated groups waiting to be scored, whatever max_staleness and
# queue_maxsize say (a constructor default the config does not reach).
TRL_SCORE_QUEUE_GROUPS = 16


def score_queue_groups(max_staleness: int, samples_per_step: int, queue_maxsize: int, num_generations: int,
                       max_inflight_tasks: int, token_budget: int = 0) -> int | None:
    """How many generated groups may wait to be scored so that generation runs no further ahead of the trainer than
    `max_staleness` steps, or None to leave TRL's own queue. Ahead of the trainer are the rollout buffer, the answers
    in flight, the group being scored and this queue: the bound is what the staleness allows beyond the first three,
    in groups (at least 1, at most TRL's). None where no bound follows: an unbounded buffer, packing (a step's rows
    then hold any number of answers), or a buffer that alone holds all the staleness allows (TRL's default of 1,024;
    the queue is not what runs ahead there, and a bound would only stall generation while a group is scored: on an
    H100, seed 004's shape, the queue at one group gave a sustained step of 13.12 s against 12.70 s with TRL's)."""
    if queue_maxsize <= 0 or token_budget or queue_maxsize >= max_staleness * samples_per_step:
        return None
    ahead = max_staleness * samples_per_step - queue_maxsize - max(0, max_inflight_tasks) - num_generations
    return max(1, min(TRL_SCORE_QUEUE_GROUPS, -(-ahead // max(1, num_generations))))


def bound_score_queue(args, world_size: int) -> int | None:
    """Rebind the rollout worker the trainer module builds to one whose scoring queue holds what *args* (an
    AsyncGRPOConfig) allow (score_queue_groups), or back to TRL's own where no bound follows; the bound, or None.

    With TRL's 16, a trainer-bound run's generator keeps ~16 groups (128 answers of the CPU rehearsal, 8 of its steps)
    ready ahead of the trainer; with max_staleness 2 they are thrown away in bursts (74 % of the rehearsal's answers
    were dropped as stale, and the steps that waited for fresh ones took 6-13 s instead of 2)."""
    base = getattr(trainer_module.AsyncRolloutWorker, "_grpo_base", trainer_module.AsyncRolloutWorker)
    samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size
    groups = score_queue_groups(args.max_staleness, samples_per_step, args.queue_maxsize, args.num_generations,
                                args.max_inflight_tasks, args.token_budget or 0)
    if groups is None:
        trainer_module.AsyncRolloutWorker = base  # an earlier trainer in this process may have bound it
        return None

    class BoundedRolloutWorker(base):
        _grpo_base = base

        def __init__(self, **kwargs):
            kwargs.setdefault("score_queue_maxsize", groups)
            super().__init__(**kwargs)

    trainer_module.AsyncRolloutWorker = BoundedRolloutWorker
    return groups


class _ResponseRecorder:
    """Stands in for the `requests` module inside TRL's client for one call, keeping the last response it saw."""

    def __init__(self, requests_module):
        self.requests = requests_module
        self.last = None

    def post(self, *args, **kwargs):
        self.last = self.requests.post(*args, **kwargs)
        return self.last

    def __getattr__(self, name):
        return getattr(self.requests, name)


class InstrumentedVLLMClient(client_module.VLLMClient):
    """TRL's HTTP client whose adapter loads are timed and recorded with the server's real status and body.

    TRL's `load_lora_adapter` runs unchanged; only the `requests` name it resolves is swapped for the duration of
    the call, so that a 404 "No adapter found for <path>" (a path the server cannot see) is recorded verbatim, and an
    answer that means the server could not read the adapter raises a StorageFault naming the path, the identity and
    the fix instead of TRL's "does not expose /v1/load_lora_adapter".
    """

    def __init__(self, server_url: str, server_timeout: float, publisher: AdapterPublisher, served_check=None):
        super().__init__(server_url, server_timeout)
        self.publisher = publisher
        self.served_check = served_check  # served_policy.ServedPolicyCheck (rank 0), or None
        self.last_failure: str | None = None
        self.warmed = False

    def __reduce__(self):  # pickles as a plain TRL client; the publisher holds an open metrics file
        return client_module.VLLMClient, (self.server_url, self.server_timeout)

    def load_lora_adapter(self, lora_name: str, lora_path: str, timeout: int = 1800) -> None:
        recorder = _ResponseRecorder(client_module.requests)
        client_module.requests = recorder
        started = time.time()
        raised = None
        try:
            super().load_lora_adapter(lora_name, lora_path, timeout=timeout)
        except BaseException as error:
            raised = error
        finally:
            client_module.requests = recorder.requests
            response = recorder.last
            status = response.status_code if response is not None else None
            detail = None
            if status != 200:
                detail = response.text[:1000] if response is not None else f"{type(raised).__name__}: {raised}"
                self.last_failure = f"POST /v1/load_lora_adapter {lora_name} -> {status}: {detail}"
            self.publisher.record_load(lora_name, lora_path, status, started, time.time(), error=detail)
        if raised is not None:
            if response is not None and storage_faults.server_cannot_read(status, detail):
                # TRL words every 404 as "does not expose /v1/load_lora_adapter"; the server's body says why.
                message = storage_faults.adapter_unreadable_message(
                    lora_name, lora_path, status, detail, os.getuid(), os.getgid(), storage_faults.view(lora_path))
                fault = storage_faults.Fault("adapter-unreadable", lora_path, message)
                raise storage_faults.StorageFault(fault) from raised
            raise raised
        if self.served_check is not None:  # checked in its own thread: the server stays paused until TRL resumes it
            self.served_check.submit(lora_name, lora_path)
        if not self.warmed:
            self.warmed = True
            threading.Thread(target=self._warm_up, args=(lora_name,), name="lora-warm-up", daemon=True).start()

    def _warm_up(self, lora_name: str) -> None:
        """One 1-token completion with the first adapter, in the background, so that a server's first LoRA generation
        overlaps the rollout worker's start-up instead of landing on the first training step. On the CPU rehearsal it
        answers in 0.0-0.1 s (the 18 s once blamed on a cold LoRA path was vLLM compiling its logprobs helper, which
        the cpu profile now turns off; docs/MEASUREMENTS.md). Best effort: failures only log."""
        started = time.time()
        try:
            response = client_module.requests.post(
                f"{self.server_url}/v1/completions", json={"model": lora_name, "prompt": "ok", "max_tokens": 1},
                timeout=600)
            log.info(f"LoRA warm-up with {lora_name}: HTTP {response.status_code} in {time.time() - started:.1f} s")
        except Exception as error:  # noqa: BLE001 - a warm-up must never break training
            log.warning(f"LoRA warm-up with {lora_name} failed: {error}")


def instrument_adapter_sync(trainer, publisher: AdapterPublisher, served_check=None) -> None:
    """Publish adapters in `publisher.lora_dir`, fsync them before each load, and record every load; with
    *served_check* (served_policy.ServedPolicyCheck), check after each load that the server serves the adapter."""
    trainer_module.save_lora_adapter = publisher.wrap_save(trainer_module.save_lora_adapter)
    trainer._lora_dir = os.path.abspath(publisher.lora_dir)
    if trainer.vllm_client is not None:
        trainer.vllm_client = InstrumentedVLLMClient(
            trainer.vllm_client.server_url, trainer.vllm_client.server_timeout, publisher, served_check
        )


FAILPOINT_DIR = failpoint.FAILPOINT_DIR  # one folder for the fault suite's files, the proxy's too
PAUSE_MID_SAVE = "pause-mid-save"


def install_failpoints(trainer, output_dir: str, emit) -> None:
    """Fault-suite hooks, inert unless their file exists under `<output_dir>/.failpoints/` (tests/faults creates it
    on the shared volume; nothing in the kit does). `pause-mid-save`: the next checkpoint save stops after the weights
    and the optimizer state, before `trainer_state.json`, for the seconds the file holds (at most 600), announced by a
    `failpoint` event — so a test can kill the trainer in the middle of a real save. The file is removed on use."""
    original = trainer._save_rng_state

    def save_rng_state(checkpoint_dir):
        flag = os.path.join(output_dir, FAILPOINT_DIR, PAUSE_MID_SAVE)
        if os.path.isfile(flag):
            try:
                with open(flag, encoding="utf-8") as handle:
                    seconds = float(handle.read().strip() or 60)
                if not 0 <= seconds <= 600:
                    raise ValueError(f"{seconds!r} is not a number of seconds from 0 to 600")
                os.remove(flag)
            except (OSError, ValueError) as error:
                log.warning(f"failpoint {flag} ignored: {error}")
            else:
                emit("failpoint", name=PAUSE_MID_SAVE, checkpoint=str(checkpoint_dir), seconds=seconds)
                time.sleep(seconds)
        return original(checkpoint_dir)

    trainer._save_rng_state = save_rng_state
