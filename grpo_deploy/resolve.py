"""Resolve a spec against its hosts' profiles into every effective setting, with where each came from and why.

Pure: no I/O beyond reading package data. Order of precedence: profile value -> spec field -> spec override.
Cross-field rules that need the merged values (adapter slots vs staleness, LoRA rank slots, context length,
verl batch divisibility, retention keys the pinned verl accepts) are checked here, with errors that name
the spec key to change.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from . import profiles
from .runtime.config import ATTENTION_SHIM_MODES, DEVICES
from .spec import LoadedSpec, Problem, SpecError, key_str

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_KEYS = {
    "gpu_memory_utilization", "max_num_seqs", "dtype", "extra_args", "max_loras", "max_lora_rank", "max_cpu_loras",
    "max_model_len", "enforce_eager", "port", "enable_prefix_caching", "max_num_batched_tokens", "kv_cache_dtype",
    "swap_space", "load_format", "env",
}
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Rendered env files are plain files on disk: names that look like credentials are refused (pass those at start).
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "ACCESS_KEY", "CREDENTIAL")
MODEL_KEYS = {"path", "served_name", "max_prompt_length"}
LORA_KEYS = {"r", "alpha", "dropout", "target_modules"}
DATA_KEYS = {"dataset", "rewards", "num_prompts", "path"}
RUNTIME_KEYS = {"device", "attention_shim", "response_template"}
# verl 0.9.1 keys that the seed or older docs use but the pinned version rejects, with what to use instead.
VERL_REJECTED = {
    "trainer.save_total_limit": "verl 0.9.1 has no trainer.save_total_limit (Hydra: 'Could not override'); "
    "set checkpoints.keep, rendered as trainer.max_actor_ckpt_to_keep",
    "trainer.max_actor_ckpt_to_keep": "set checkpoints.keep instead (one place for retention)",
    "trainer.save_freq": "set checkpoints.save_every instead",
    "trainer.default_local_dir": "set checkpoints.dir instead",
    "trainer.resume_mode": "set checkpoints.resume instead",
}
VERL_PREFIXES = ("algorithm.", "data.", "actor_rollout_ref.", "trainer.", "reward_model.", "critic.", "ray_kwargs.",
                 "custom_reward_function.", "+")
DATASET_SIZES = {"gsm8k": 7473, "boxed-math": 1460}
SERVER_PORT = 8000


@cache
def trl_fields() -> frozenset[str]:
    text = (resources.files("grpo_deploy") / "trl_config_fields.txt").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


@cache
def known_models() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((resources.files("grpo_deploy") / "models.yaml").read_text(encoding="utf-8"))


ALLOWED_KEYS = {"model": MODEL_KEYS, "lora": LORA_KEYS, "data": DATA_KEYS, "vllm": VLLM_KEYS, "runtime": RUNTIME_KEYS}


@dataclass(frozen=True)
class Value:
    value: Any
    source: str  # "profile:<name>", "spec", "override", "derived"
    why: str


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    umask: str

    @property
    def user(self) -> str:
        return f"{self.uid}:{self.gid}"


@dataclass
class Resolved:
    loaded: LoadedSpec
    profiles: dict[str, profiles.Profile]  # host name -> profile
    sections: dict[str, dict[str, Value]] = field(default_factory=dict)
    identities: dict[str, Identity] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)
    architecture: dict[str, Any] | None = None

    @property
    def spec(self):
        return self.loaded.spec

    @property
    def engine(self) -> str:
        return self.spec.engine

    @property
    def run_dir(self) -> str:
        return f"{self.spec.storage.mount}/runs/{self.spec.run.name}"

    def v(self, section: str, key: str, default: Any = None) -> Any:
        value = self.sections.get(section, {}).get(key)
        return default if value is None else value.value

    def hosts_with(self, role: str):
        return [h for h in self.spec.hosts if role in h.roles]

    def host_for(self, role: str):
        hosts = self.hosts_with(role)
        return hosts[0] if hosts else None

    @property
    def server_url(self) -> str:
        server = self.host_for("server")
        trainer = self.host_for("trainer")
        if server is None:
            return ""
        port = self.v("vllm", "port", SERVER_PORT)
        if trainer is not None and trainer.name == server.name:
            return f"http://server:{port}"  # the compose service name, same host
        return f"http://{_host_part(server.address) if server.address != 'local' else server.name}:{port}"

    @property
    def checkpoint_dir(self) -> str:
        return self.v("checkpoints", "dir")

    @property
    def keep(self) -> int | None:
        """Checkpoints kept; None = keep all."""
        return self.v("checkpoints", "keep")

    @property
    def adapter_slots(self) -> int:
        """Adapter versions TRL keeps loaded on the server at once: trl.max_staleness + 2."""
        return int(self.v("trl", "max_staleness", 4)) + 2


def _host_part(address: str) -> str:
    host = address.split("@", 1)[-1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _role_profile(loaded: LoadedSpec, role: str) -> profiles.Profile:
    host = next(h for h in loaded.spec.hosts if role in h.roles)
    return profiles.load(host.profile)


def resolve(loaded: LoadedSpec) -> Resolved:
    """Merge profiles, spec fields and overrides; raise SpecError on any cross-field rule broken."""
    spec = loaded.spec
    res = Resolved(loaded, {h.name: profiles.load(h.profile) for h in spec.hosts})
    problems: list[Problem] = []

    def problem(path: tuple[Any, ...], message: str) -> None:
        problems.append(Problem(loaded.doc.where(path), key_str(path), message))

    main_role = "trainer" if spec.engine == "trl-async" else "head"
    main_profile = _role_profile(loaded, main_role)
    server_profile = _role_profile(loaded, "server") if spec.engine == "trl-async" else main_profile

    def from_profile(section: str, profile: profiles.Profile) -> dict[str, Value]:
        return {k: Value(s.value, f"profile:{profile.name}", s.why)
                for k, s in profile.settings.get(section, {}).items()}

    for section in ("model", "lora", "data", "trl", "verl", "runtime", "checkpoints"):
        res.sections[section] = from_profile(section, main_profile)
    res.sections["vllm"] = from_profile("vllm", server_profile)

    # Spec fields.
    def put(section: str, key: str, value: Any, why: str, source: str = "spec") -> None:
        if value is not None:
            res.sections[section][key] = Value(value, source, why)

    put("model", "path", spec.model.path, "set in the spec (model.path)")
    put("model", "served_name", spec.model.served_name or (spec.model.path if spec.model.path else None),
        "set in the spec (model.served_name, else model.path)")
    put("data", "dataset", spec.dataset.name, "set in the spec (dataset.name)")
    put("data", "path", spec.dataset.path, "set in the spec (dataset.path)")
    ck = spec.checkpoints
    put("checkpoints", "save_every", ck.save_every, "set in the spec (checkpoints.save_every)")
    if ck.keep == "all":
        res.sections["checkpoints"]["keep"] = Value(None, "spec", "keep every checkpoint (checkpoints.keep: all)")
    else:
        put("checkpoints", "keep", ck.keep, "set in the spec (checkpoints.keep)")
    put("checkpoints", "dir", ck.dir or f"{res.run_dir}/checkpoints",
        "checkpoints.dir" if ck.dir else "default: on the shared volume, so a resume finds it from any host",
        "spec" if ck.dir else "derived")
    put("checkpoints", "resume", ck.resume, "checkpoints.resume")
    put("checkpoints", "disk_margin_gb", ck.disk_margin_gb, "checkpoints.disk_margin_gb")

    # Overrides.
    for section, entries in spec.overrides.items():
        for key, value in entries.items():
            path = ("overrides", section, key)
            if section == "trl" and key not in trl_fields():
                problem(path, "not an AsyncGRPOConfig field of trl 1.16.0 (see grpo_deploy/trl_config_fields.txt)")
                continue
            if section == "verl":
                if key in VERL_REJECTED:
                    problem(path, VERL_REJECTED[key])
                    continue
                if not key.startswith(VERL_PREFIXES):
                    problem(path, f"not a verl Hydra key (expected one starting with {', '.join(VERL_PREFIXES)})")
                    continue
            if section in ALLOWED_KEYS and key not in ALLOWED_KEYS[section]:
                problem(path, f"unknown {section} setting; allowed: {', '.join(sorted(ALLOWED_KEYS[section]))}")
                continue
            why = f"overrides.{section}.{key} in the spec"
            earlier = res.sections.get(section, {}).get(key)
            if isinstance(value, dict) and earlier is not None and isinstance(earlier.value, dict):
                # A mapping (e.g. vllm.env) adds to the profile's key by key rather than replacing it: a user who adds
                # a logging variable keeps the profile's tuned ones (an empty value blanks one).
                value, why = {**earlier.value, **value}, f"{why}, merged over {earlier.source}"
            res.sections.setdefault(section, {})[key] = Value(value, "override", why)

    for key, allowed in (("attention_shim", ATTENTION_SHIM_MODES), ("device", DEVICES)):
        value = res.v("runtime", key)
        if value is not None and value not in allowed:
            problem(("overrides", "runtime", key), f"{value!r} is not one of {', '.join(allowed)} "
                    "(quote on/off in YAML: unquoted they read as booleans)")

    _check_server_env(res, problem)

    # Identities: one UID/GID for every role unless the spec deliberately splits them.
    run = spec.run
    for role in ("server", "trainer", "head", "worker"):
        ident = run.roles.get(role)
        res.identities[role] = Identity(
            uid=ident.uid if ident and ident.uid is not None else run.uid,
            gid=ident.gid if ident and ident.gid is not None else run.gid,
            umask=(ident.umask if ident and ident.umask else run.umask),
        )

    # Images.
    if spec.engine == "trl-async":
        res.images["server"] = spec.images.server or server_profile.images.get("server", "")
        res.images["trainer"] = spec.images.trainer or main_profile.images.get("trainer", "")
    else:
        res.images["verl"] = spec.images.verl or main_profile.images.get("verl", "")

    # Architecture for size estimates.
    model_path = res.v("model", "path")
    res.architecture = spec.model.architecture or known_models().get(model_path)

    if spec.engine == "trl-async":
        _derive_trl(res, problem)
    else:
        _derive_verl(res, problem)
    if problems:
        raise SpecError(problems)
    return res


def _check_server_env(res: Resolved, problem) -> None:
    """vllm.env: extra environment for the server role (name -> scalar), never a credential."""
    env = res.v("vllm", "env")
    if env is None:
        return
    path = ("overrides", "vllm", "env")
    if not isinstance(env, dict):
        problem(path, f"expected a mapping of environment variable names to values, got {type(env).__name__}")
        return
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            problem(path + (name,), "not an environment variable name (upper case letters, digits and _)")
        elif any(word in name for word in SECRET_WORDS):
            problem(path + (name,), "looks like a credential: rendered files must not hold secrets; export it in "
                    "the environment of `grpo-deploy up` (HF_TOKEN and WANDB_API_KEY are passed through) instead")
        elif isinstance(value, (dict, list)) or value is None:
            problem(path + (name,), "expected a string or number")


def _override_path(section: str, key: str) -> tuple[Any, ...]:
    """The spec key a user changes to fix a broken rule (an override, whether or not it is written yet)."""
    return ("overrides", section, key)


def gpu_split(res: Resolved, host) -> dict[str, list[int]]:
    """GPU indices per role on *host*: the spec's hosts[].gpus, else server on GPU 0 and the trainer on the rest
    when both roles share a host, else every GPU of the profile for the one role."""
    profile = res.profiles[host.name]
    if profile.accelerator != "cuda":
        return {}
    n = int(profile.hardware.get("gpus_per_host", 1))
    given = dict(host.gpus or {})
    roles = host.roles
    if len(roles) == 2 and not profile.hardware.get("unified_memory", False):
        given.setdefault("server", [0])
        given.setdefault("trainer", list(range(1, n)))
    for role in roles:
        given.setdefault(role, list(range(n)))
    return given


def _derive_trl(res: Resolved, problem) -> None:
    trl, vllm = res.sections["trl"], res.sections["vllm"]
    for i, host in enumerate(res.spec.hosts):
        split = gpu_split(res, host)
        if split and any(not ids for ids in split.values()):
            problem(("hosts", i, "gpus"), f"host {host.name} runs both roles but its profile "
                    f"{res.profiles[host.name].name} has {res.profiles[host.name].hardware.get('gpus_per_host')} GPU: "
                    "give each role its own GPUs, e.g. gpus: {server: [0], trainer: [1]}, or use two hosts")
        elif split and "server" in split and "trainer" in split and set(split["server"]) & set(split["trainer"]) \
                and not res.profiles[host.name].hardware.get("unified_memory", False):
            problem(("hosts", i, "gpus"), "server and trainer share a GPU: vLLM reserves gpu_memory_utilization of it "
                    "and the trainer runs out of memory; give them separate GPUs")
    slots = res.adapter_slots
    staleness = slots - 2
    r = int(res.v("lora", "r", 8))

    def derive(key: str, value: Any, why: str) -> None:
        if key not in vllm:
            vllm[key] = Value(value, "derived", why)

    derive("max_loras", slots, f"max_staleness ({staleness}) + 2: TRL keeps that many adapter versions loaded")
    derive("max_cpu_loras", int(res.v("vllm", "max_loras")), "same as max_loras")
    fitting = [x for x in VLLM_LORA_RANKS if x >= r]
    derive("max_lora_rank", fitting[0] if fitting else r, f"smallest vLLM LoRA rank slot >= lora.r ({r})")
    need_len = int(res.v("model", "max_prompt_length", 512)) + int(res.v("trl", "max_completion_length", 256))
    derive("max_model_len", need_len, "max_prompt_length + max_completion_length")
    derive("port", SERVER_PORT, "vLLM's default port")

    max_loras = res.v("vllm", "max_loras")
    if int(max_loras) < slots:
        problem(
            _override_path("vllm", "max_loras"),
            f"vllm max_loras={max_loras} is too small for trl max_staleness={staleness}: TRL keeps up to "
            f"max_staleness + 2 = {slots} adapter versions loaded, and a load beyond the slots evicts one "
            f"still in use. Set it to >= {slots} or lower trl.max_staleness",
        )
    rank = res.v("vllm", "max_lora_rank")
    if rank not in VLLM_LORA_RANKS:
        problem(_override_path("vllm", "max_lora_rank"),
                f"max_lora_rank={rank} is not one vLLM accepts; allowed: {', '.join(map(str, VLLM_LORA_RANKS))}")
    elif int(rank) < r:
        problem(_override_path("vllm", "max_lora_rank"),
                f"max_lora_rank={rank} is below the adapter's rank lora.r={r}: the server would refuse the adapter")
    if int(res.v("vllm", "max_model_len")) < need_len:
        problem(_override_path("vllm", "max_model_len"),
                f"max_model_len={res.v('vllm', 'max_model_len')} < "
                f"max_prompt_length + max_completion_length = {need_len}")
    gmu = float(res.v("vllm", "gpu_memory_utilization", 0.9))
    if not 0 < gmu <= 1:
        problem(_override_path("vllm", "gpu_memory_utilization"), "must be in (0, 1]")
    if res.v("trl", "max_inflight_tasks") and res.v("vllm", "max_num_seqs") and \
            int(res.v("trl", "max_inflight_tasks")) > int(res.v("vllm", "max_num_seqs")) * 4:
        problem(_override_path("trl", "max_inflight_tasks"),
                "max_inflight_tasks is more than 4x the server's max_num_seqs: requests would only queue")
    if res.v("checkpoints", "save_every"):
        trl.setdefault("save_strategy", Value("steps", "derived", "checkpoints.save_every"))
        trl["save_steps"] = Value(res.v("checkpoints", "save_every"), "derived", "checkpoints.save_every")
    if res.keep is not None:
        trl["save_total_limit"] = Value(res.keep, "derived", "checkpoints.keep")
    for key in ("output_dir", "vllm_server_base_url"):
        if key in trl and trl[key].source == "override":
            problem(("overrides", "trl", key), "set by the kit from storage.mount / hosts; do not override")


def _derive_verl(res: Resolved, problem) -> None:
    verl = res.sections["verl"]
    nnodes = len(res.hosts_with("head")) + len(res.hosts_with("worker"))
    verl["trainer.nnodes"] = Value(nnodes, "derived", "one Ray node per host with role head or worker")
    n_gpus = int(res.v("verl", "trainer.n_gpus_per_node", 1))
    tp = int(res.v("verl", "actor_rollout_ref.rollout.tensor_model_parallel_size", 1))
    world = n_gpus * nnodes
    tbs, n = int(res.v("verl", "data.train_batch_size", 1024)), int(res.v("verl", "actor_rollout_ref.rollout.n", 1))
    mini = int(res.v("verl", "actor_rollout_ref.actor.ppo_mini_batch_size", tbs))
    if world % tp:
        problem(_override_path("verl", "actor_rollout_ref.rollout.tensor_model_parallel_size"),
                f"rollout TP={tp} does not divide the {world} GPUs (n_gpus_per_node x nnodes)")
    if (tbs * n) % world:
        problem(_override_path("verl", "data.train_batch_size"),
                f"data.train_batch_size x rollout.n = {tbs * n} is not divisible by the {world} GPUs")
    if tbs < mini:
        problem(_override_path("verl", "actor_rollout_ref.actor.ppo_mini_batch_size"),
                f"ppo_mini_batch_size {mini} > data.train_batch_size {tbs}")
    if int(res.v("lora", "r", 0)) > 512:
        problem(_override_path("lora", "r"), "verl's vLLM rollout accepts LoRA ranks up to 512")


def as_dict(res: Resolved) -> dict[str, Any]:
    """Plain-data view for --json and for explaining values."""
    return {
        section: {k: {"value": v.value, "source": v.source, "why": v.why} for k, v in values.items()}
        for section, values in res.sections.items()
    }


def dumps(res: Resolved) -> str:
    return json.dumps(as_dict(res), indent=2, sort_keys=True, default=str)
