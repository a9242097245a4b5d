"""The verl engine: verl with colocated vLLM, on one node or a Ray cluster of a head and workers. It owns verl's batch
and parallelism rules, its Hydra overrides (and how a value is quoted for Hydra), each host's compose environment,
the Ray cluster's values for Kubernetes, the rollout's memory, the FSDP checkpoint's size, the run's steps and its
knobs (grpo_deploy.engines.verl_knobs)."""

from __future__ import annotations

import json
import re
from typing import Any

from grpo_deploy.architecture import Architecture
from grpo_deploy.common.values import CONTROL, MAX_STEPS, host_part
from grpo_deploy.diagnose import verl as diagnose_verl
from grpo_deploy.engines import verl_knobs
from grpo_deploy.engines.base import COMMON_SECTIONS, GB, ClusterPorts, Engine, Resolved, RestartWords
from grpo_deploy.names import COMPOSE_INFINIBAND, COMPOSE_VERL, COMPOSE_VERL_CLUSTER, project_name
from grpo_deploy.runtime.verl import data as verl_data
from grpo_deploy.runtime.verl.ray_node import GCS_PORT, NODE_PORTS, PEER_PORTS, WORKER_PORTS
from grpo_deploy.templating import RenderError, template

DATASET_SIZES = {"gsm8k": 7473, "boxed-math": 1460}
"""Training prompts of the known datasets (steps per epoch = size // train_batch_size); dataset.size overrides."""
LOSS_AGG_KEY = "actor_rollout_ref.actor.loss_agg_mode"
VERL_LOSS_WORDS = {
    "token-mean": "per token over the whole batch (every token weighs the same)",
    "token-sum": "sum over tokens (longer answers weigh more, no normalisation)",
    "seq-mean-token-sum": "per answer of its token sum (longer answers weigh more)",
    "seq-mean-token-mean": "per answer (each answer's token-mean, answers weighted equally: GRPO's original)",
    "seq-mean-token-sum-norm": "per answer of its token sum / a fixed length (Dr. GRPO)",
}
"""verl 0.9.1's loss_agg_mode values (trainer/config/actor/actor.yaml) in words."""
CKPT_EXTRA_BYTES = 8 * 1024**2  # tokenizer/config (huggingface/), extra state, data.pt: a few MB


def _override(key: str) -> tuple[Any, ...]:
    """The spec key a user changes to fix a broken rule (an override, whether or not it is written yet)."""
    return ("overrides", "verl", key)


class Verl(Engine):
    def derive(self, res: Resolved, problem, derived: list) -> None:
        verl = res.settings.verl
        nnodes = len(res.hosts_with("head")) + len(res.hosts_with("worker"))
        derived.append(("verl", "trainer.nnodes", nnodes, "one Ray node per host with role head or worker"))
        world = verl.n_gpus_per_node * nnodes
        tbs, n, tp = verl.train_batch_size, verl.rollout_n, verl.rollout_tp
        mini = verl.ppo_mini_batch_size or tbs
        if world % tp:
            problem(_override("actor_rollout_ref.rollout.tensor_model_parallel_size"),
                    f"rollout TP={tp} does not divide the {world} GPUs (n_gpus_per_node x nnodes)")
        if (tbs * n) % world:
            problem(_override("data.train_batch_size"),
                    f"data.train_batch_size x rollout.n = {tbs * n} is not divisible by the {world} GPUs")
        size = _dataset_size(res)
        if verl.total_training_steps is None and size // tbs * verl.total_epochs > MAX_STEPS:
            problem(("dataset", "size") if res.spec.dataset.size else _override("trainer.total_epochs"),
                    f"{size} prompts / data.train_batch_size {tbs} x trainer.total_epochs {verl.total_epochs} is "
                    f"more than {MAX_STEPS} steps; set overrides.verl.trainer.total_training_steps")
        if tbs < mini:
            problem(_override("actor_rollout_ref.actor.ppo_mini_batch_size"),
                    f"ppo_mini_batch_size {mini} > data.train_batch_size {tbs}")
        for i, host in enumerate(res.spec.hosts):
            for role, gpus in (host.gpus or {}).items():
                if len(gpus) < verl.n_gpus_per_node:
                    problem(("hosts", i, "gpus", role), f"{len(gpus)} GPU(s) listed for {role} but "
                            f"trainer.n_gpus_per_node is {verl.n_gpus_per_node}: Ray would count fewer GPUs than verl "
                            "asks for (list that many, or lower overrides.verl.trainer.n_gpus_per_node)")
        if res.settings.lora.r > 512:
            problem(("overrides", "lora", "r"), "verl's vLLM rollout accepts LoRA ranks up to 512")

    def config_files(self, res: Resolved, publish_ips: dict[str, str] | None = None) -> dict[str, str]:
        return {"config/verl-overrides.txt": (
            f"# Hydra overrides for verl 0.9.1 (python -m verl.trainer.main_ppo), run {res.spec.run.name}.\n"
            + "\n".join(verl_overrides(res)) + "\n"),
            "config/verl-node.json": json.dumps(node_config(self, res), indent=2) + "\n"}

    def host_files(self, res: Resolved, host, config_dir: str,
                   publish_ips: dict[str, str] | None = None) -> dict[str, str]:
        """*publish_ips*: each node's address as the deployer resolved it on the hosts (empty for `render`: the
        head is then named by its address and each node's address left to Ray)."""
        spec = res.spec
        profile = res.profiles[host.name]
        cluster = is_cluster(res)
        compose_files = self.compose_files(res, host, COMPOSE_VERL) + \
            ([COMPOSE_VERL_CLUSTER] if cluster else []) + ([COMPOSE_INFINIBAND] if cluster and host.infiniband else [])
        addresses = publish_ips or {}
        return {f"hosts/{host.name}.env": template(
            "verl.env.j2", host=host, run_name=spec.run.name, project=project_name(spec.run.name),
            profile=profile.name, images=res.images, compose_files=compose_files,
            services=[r for r in self.roles if r in host.roles], identities=res.identities, mount=spec.storage.mount,
            volume=spec.storage.volume, config_dir=config_dir,
            ray_role="head" if "head" in host.roles else "worker", ray=ray_resources(res, profile),
            shm_size="2g" if profile.accelerator != "cuda" else "32g", nfs=spec.storage.nfs,
            shared_dir=host.shared_dir, cluster=cluster, node_ip=addresses.get(host.name, "") if cluster else "",
            ifname=host.interface or "", head=head_address(res, addresses) if cluster else "",
        )}

    def cluster_nodes(self, res: Resolved) -> list:
        return cluster_hosts(res) if is_cluster(res) else []

    def spans_hosts(self, spec) -> bool:
        return sum(1 for h in spec.hosts if {"head", "worker"} & set(h.roles)) > 1

    def cluster_ports(self, res: Resolved) -> ClusterPorts | None:
        """Ray's fixed ports: the head's GCS and every node's own, its worker processes' range."""
        if not is_cluster(res):
            return None
        node = tuple(NODE_PORTS.values())
        return ClusterPorts("Ray's", first=(GCS_PORT, *node), others=node, ranges=(WORKER_PORTS,),
                            reach_first=PEER_PORTS, reach_all=tuple(p for p in PEER_PORTS if p != GCS_PORT))

    def k8s_params(self, res: Resolved) -> dict[str, Any]:
        """The pods of a Ray cluster: one head and ray_workers workers, each of gpus_per_node; NCCL's and Gloo's
        interface (the head host's hosts[].interface, else eth0: a pod's interface on every CNI)."""
        verl = res.settings.verl
        return {"gpus_per_node": verl.n_gpus_per_node, "ray_workers": verl.nnodes - 1,
                "socket_ifname": res.hosts_with("head")[0].interface or "eth0"}

    def memory(self, res: Resolved, arch: Architecture, host, role: str, cap: float) -> dict[str, Any] | None:
        verl = res.settings.verl
        weights = arch.params() * 2
        n, gmu, tp = verl.n_gpus_per_node, verl.rollout_memory, verl.rollout_tp
        shard = arch.params() * 4 / max(n * len(res.hosts_with("head") + res.hosts_with("worker")), 1)
        return {"role": role, "rollout_pool_gb_per_gpu": round(gmu * cap / GB, 1),
                "rollout_weights_gb_per_gpu": round(weights / tp / GB, 2),
                "actor_shard_fp32_gb_per_gpu": round(shard / GB, 2), "fits": weights / tp < gmu * cap,
                "why": f"TP={tp}: each GPU holds 1/{tp} of the bf16 weights inside the rollout pool"}

    def checkpoint_bytes(self, res: Resolved, arch: Architecture,
                         step: int | None = None) -> tuple[int, int, list[str]]:
        """The FSDP checkpoint holds the frozen base too (unless save_lora_only): every save the same size."""
        lora = arch.lora_params(res.settings.lora.r, res.settings.lora.target_modules)
        adapter = lora * 4  # PEFT saves the fp32 LoRA weights
        optim = lora * 8  # Adam: two fp32 moments per trainable parameter
        base_bytes = 2 if res.settings.verl.model_dtype in ("bf16", "bfloat16") else 4
        base = 0 if res.settings.verl.save_lora_only else arch.params() * base_bytes
        total = base + adapter + optim + CKPT_EXTRA_BYTES
        why = [f"verl FSDP checkpoint = frozen base in {'bf16' if base_bytes == 2 else 'fp32 (model_dtype default)'} "
               f"{base / GB:.2f} GB + LoRA {adapter / GB:.3f} GB + Adam state {optim / GB:.3f} GB"]
        return total, 0, why

    def diagnose(self, events, res: Resolved):
        """Seed 000's knobs over verl's per-phase timings (grpo_deploy.diagnose.verl)."""
        return diagnose_verl.diagnose(events, diagnose_verl.settings_hint(res)), diagnose_verl.LABELS

    def loss_objective(self, res: Resolved) -> str:
        """verl's actor.loss_agg_mode (the render passes the spec's through; verl 0.9.1's default is token-mean,
        normalised by the global batch's token count)."""
        mode = (res.settings.verl.model_extra or {}).get(LOSS_AGG_KEY)
        if mode is None:
            return (f"{VERL_LOSS_WORDS['token-mean']} ({LOSS_AGG_KEY} not set: verl 0.9.1's default token-mean; set it "
                    "in overrides.verl to hold the weighting whatever verl's default becomes)")
        words = VERL_LOSS_WORDS.get(str(mode), "a mode this kit does not describe")
        return f"{words} ({LOSS_AGG_KEY}={mode})"

    def samples_in_step(self, res: Resolved, step: dict[str, Any]) -> float | None:
        """verl logs no sample count: its steps are train_batch_size prompts x rollout n answers each."""
        verl = res.settings.verl
        return float(verl.train_batch_size * verl.rollout_n) if verl.rollout_n else None

    def total_steps(self, res: Resolved) -> int:
        verl = res.settings.verl
        if verl.total_training_steps:
            return verl.total_training_steps
        return (_dataset_size(res) // verl.train_batch_size) * verl.total_epochs

    def epochs(self, res: Resolved) -> int | None:
        """verl.total_epochs, unless verl.total_training_steps sets the steps."""
        verl = res.settings.verl
        return None if verl.total_training_steps else verl.total_epochs

    def node_gpus(self, res: Resolved) -> tuple[int, str, str] | None:
        return (res.settings.verl.n_gpus_per_node, "trainer.n_gpus_per_node",
                "overrides.verl.trainer.n_gpus_per_node")

    def max_completion_length(self, res: Resolved) -> int | None:
        value = res.settings.verl.overrides(["data.max_response_length"]).get("data.max_response_length")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def watch(self, res: Resolved) -> dict[str, Any] | None:
        """The watcher's config with verl's validation score for the run's data source (verl logs it as
        val-core/<data_source>/reward/mean@<n> on the steps it validates; the kit's runs validate one answer)."""
        config = super().watch(res)
        if config is not None:
            config["keys"]["validation"] = f"val-core/{verl_data.SOURCES[res.settings.data.dataset]}/reward/mean@1"
        return config


RAY_CPUS_PER_GPU = 3
"""Ray CPUs verl's placement groups take per GPU (actor, rollout and reference workers share a bundle's CPUs)."""
RAY_CPUS_BESIDE = 5
"""Ray CPUs verl's other actors take on the head: the task runner, the rollout's agent loop and reward workers, and
TransferQueue's controller and storage units (as few as the cpu profile sets)."""
CPU_OBJECT_STORE_BYTES = 400_000_000
"""Ray's object store on a CPU host: inside the 2 GB /dev/shm the compose file gives the container."""


def ray_resources(res: Resolved, profile) -> dict[str, int]:
    """`ray start` resources of a host (0: Ray counts them itself). On a GPU host Ray sees the GPUs and CPUs it has;
    on a CPU host the GPUs are logical (one per trainer.n_gpus_per_node: verl asks Ray for `GPU`) and the CPUs a
    logical count verl's actors fit in (Ray's CPUs are a reservation count, not cores)."""
    if profile.accelerator == "cuda":
        return {"cpus": 0, "gpus": 0, "object_store": 0}
    gpus = res.settings.verl.n_gpus_per_node
    return {"cpus": RAY_CPUS_PER_GPU * gpus + RAY_CPUS_BESIDE, "gpus": gpus, "object_store": CPU_OBJECT_STORE_BYTES}


KIT_REWARDS = ("brevity", "boxed-math")
"""Datasets whose reward verl does not know: grpo_deploy.runtime.verl.data.compute_score scores them (GSM8K rows
carry data_source openai/gsm8k, which verl's own scorer knows)."""
KIT_REWARD_FILE = "/opt/grpo-deploy/lib/grpo_deploy/runtime/verl/data.py"
"""The reward file inside the kit's images (the package lives in /opt/grpo-deploy/lib)."""


RAY_JOIN_TIMEOUT_S = 300
"""How long the head waits for every worker to join before it refuses to start verl (workers start once the head
answers, so this covers their container start and `ray start`)."""


def node_config(engine: Engine, res: Resolved) -> dict[str, Any]:
    """config/verl-node.json: what the head does around verl (grpo_deploy.runtime.verl.node.VerlNodeConfig)."""
    s = res.settings
    return {"run_dir": res.run_dir, "dataset": s.data.dataset, "data_dir": data_dir(res),
            "data_source": data_source(res), "num_prompts": s.data.num_prompts, "checkpoint_dir": res.checkpoint_dir,
            "keep": res.keep or 0, "save_every": s.checkpoints.save_every or 0,
            "total_steps": engine.total_steps(res), "watchdog": engine.disk_watchdog(res), "watch": engine.watch(res),
            "nnodes": s.verl.nnodes, "gpus_per_node": s.verl.n_gpus_per_node, "join_timeout_s": RAY_JOIN_TIMEOUT_S}


def cluster_hosts(res: Resolved) -> list:
    """The run's Ray nodes, the head first."""
    return res.hosts_with("head") + res.hosts_with("worker")


def is_cluster(res: Resolved) -> bool:
    """Whether the run is a Ray cluster of several hosts (host networking, fixed ports, the cluster check)."""
    return res.engine_info.spans_hosts(res.spec)


def head_address(res: Resolved, addresses: dict[str, str]) -> str:
    """The head's GCS as the workers join it: its address as the deployer resolved it, else the host part of its
    spec address (Ray resolves a name itself)."""
    head = res.hosts_with("head")[0]
    ip = addresses.get(head.name) or host_part(head.address)
    return f"{ip}:{GCS_PORT}" if ip else ""


def data_dir(res: Resolved) -> str:
    """The folder of the run's verl parquet files: the folder of dataset.path when it names a parquet file in verl's
    schema (its test.parquet beside it), else <mount>/data/<dataset> on the share (the head writes train.parquet and
    test.parquet there)."""
    path = res.settings.data.path
    if path and path.endswith(".parquet"):
        return path.rsplit("/", 1)[0]
    return f"{res.spec.storage.mount}/data/{res.settings.data.dataset}"


def data_source(res: Resolved) -> str:
    """The JSONL file the head writes the parquet files from ("" when dataset.path is parquet or not given)."""
    path = res.settings.data.path
    return "" if not path or path.endswith(".parquet") else path


def _dataset_size(res: Resolved) -> int:
    return res.spec.dataset.size or DATASET_SIZES.get(res.settings.data.dataset, 0)


def verl_overrides(res: Resolved) -> list[str]:
    """Hydra overrides for `python -m verl.trainer.main_ppo` (verl 0.9.1 key names), each value quoted for Hydra."""
    spec, s = res.spec, res.settings
    keep = res.keep
    resume = s.checkpoints.resume
    out: dict[str, Any] = {
        "actor_rollout_ref.model.path": s.model.path,
        "actor_rollout_ref.model.lora_rank": s.lora.r,
        "actor_rollout_ref.model.lora_alpha": s.lora.alpha,
        "actor_rollout_ref.model.target_modules": s.lora.target_modules,
        "data.max_prompt_length": s.model.max_prompt_length,
        "data.train_files": s.data.path if s.data.path and not data_source(res) else f"{data_dir(res)}/train.parquet",
        "data.val_files": f"{data_dir(res)}/test.parquet",
        "trainer.default_local_dir": res.checkpoint_dir,
        "trainer.save_freq": s.checkpoints.save_every or -1,
        "trainer.max_actor_ckpt_to_keep": keep,
        "trainer.resume_mode": {"auto": "auto", "never": "disable"}.get(resume, "resume_path"),
        "trainer.project_name": spec.logger.project or "grpo-deploy",
        "trainer.experiment_name": spec.run.name,
        # "file": verl's per-step metrics, which the head turns into the kit's events (status, plot, progress)
        "trainer.logger": ["console", "file"] + ([_VERL_LOGGERS[spec.logger.kind]]
                                                 if spec.logger.kind in _VERL_LOGGERS else []),
    }
    # the rollout's own log-probs of its answers: verl then logs how far they are from the actor's, which the kit's
    # served-policy check reads (runtime/verl/rollout_check.py); a user's override may turn it off
    out["actor_rollout_ref.rollout.calculate_log_probs"] = True
    if s.data.dataset in KIT_REWARDS:  # the kit's own tasks: their reward is the kit's file, loaded by its path
        out["reward.custom_reward_function.path"] = KIT_REWARD_FILE
        out["reward.custom_reward_function.name"] = "compute_score"
    if resume not in ("auto", "never"):
        out["trainer.resume_from_path"] = resume
    out.update(s.verl.overrides(res.origins["verl"]))
    return [f"{k}={hydra_value(v)}" for k, v in out.items()]


_VERL_LOGGERS = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow"}
# Hydra's unquoted values: identifiers, numbers, paths, hub ids (no whitespace, quotes, brackets, commas, '$' ...).
_HYDRA_PLAIN = re.compile(r"^[A-Za-z0-9_./@+-]+$")
# Unquoted text Hydra reads as a number, a boolean or null rather than as a string.
_HYDRA_TYPED = re.compile(r"[+-]?(\d[\d_]*\.?[\d_]*([eE][+-]?\d[\d_]*)?|\.\d[\d_]*([eE][+-]?\d[\d_]*)?|inf|nan)"
                          r"|true|false|null", re.IGNORECASE)


def hydra_value(value: Any, nested: bool = False) -> str:
    """A value as Hydra's override grammar (and OmegaConf after it) reads it back: booleans True/False, None null,
    lists ["a","b"] (items double-quoted), strings plain when they hold only safe characters and would not read as a
    number, boolean or null, else single-quoted (see _hydra_quoted)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(x, nested=True) for x in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if CONTROL.search(text):
        raise RenderError(f"refusing to render {text!r} into a Hydra override: it holds a control character")
    if not nested and _HYDRA_PLAIN.fullmatch(text) and not _HYDRA_TYPED.fullmatch(text):
        return text
    return _hydra_quoted(text, '"' if nested else "'")


def _hydra_quoted(text: str, quote: str) -> str:
    """*text* quoted for Hydra: a quote inside is escaped as \\' and only backslashes that precede a quote (or the
    closing one) are doubled, the rest Hydra keeps as they are; '${' is escaped for OmegaConf (a literal, never an
    interpolation such as ${oc.env:WANDB_API_KEY}), with the backslashes before it doubled."""
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    text = re.sub(rf"(\\*)({quote}|$)", lambda m: m.group(1) * 2 + ("\\" + quote if m.group(2) else ""), text)
    return quote + text + quote


VERL = Verl(
    name="verl",
    description="verl with colocated vLLM (one node, or a Ray cluster of a head and workers)",
    roles=("head", "worker"),
    main_role="head",
    role_images={"head": "verl", "worker": "verl"},
    role_counts={"head": (1, 1), "worker": (0, 1 << 16)},
    sections=COMMON_SECTIONS + ("verl",),
    checkpoint_layout="verl",
    reader_role="worker",
    logger_keys={"project": ("wandb", "tensorboard", "mlflow"), "entity": ()},  # no entity reaches verl's W&B
    single_host_roles=("head",),
    multi_host_roles=(("head",), ("worker",)),
    exclusive_roles=("head", "worker"),
    saves_last_step=True,
    # the kit's names for verl's score and length (runtime/verl_node.STEP_KEYS), verl's own for the rest; verl is
    # synchronous (no staleness) and logs no importance ratio
    steps_setting="overrides.verl.trainer.total_training_steps",
    tune_figures={"tokens_per_s_per_gpu": "perf/throughput"},
    watch_keys={"reward": "reward", "length": "completions/mean_length", "capped": "response_length/clip_ratio",
                "kl": "actor/kl_loss", "ratio": None, "staleness": None, "samples": None},
    # seed 000's telemetry: KL to the reference, gradient norm, and where a step's time goes
    progress=(("kl", "actor/kl_loss", ".4f"), ("grad", "actor/grad_norm", ".3f"), ("gen s", "timing_s/gen", ".1f"),
              ("update s", "timing_s/update_actor", ".1f"), ("step s", "timing_s/step", ".1f")),
    unreadable_share="A worker could not load the checkpoint its head saved: a resume would fail or start over",
    tune_knobs=verl_knobs.TUNE_KNOBS,
    tune_sides=verl_knobs.TUNE_SIDES,
    restart_words=RestartWords(died={"worker": "a Ray worker"}, again={"worker": "the Ray cluster"}),
)
