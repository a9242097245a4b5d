"""The names and figures every layer shares, stated once: the kit's Docker labels, the compose project and file names,
the state folders, the server's ready timeout and `up`'s restarts default. Constants only; imports nothing of the kit,
so hosts, images and the CLI alike may read it."""

from __future__ import annotations

LABEL_PREFIX = "org.grpo-deploy"
RUN_LABEL = f"{LABEL_PREFIX}.run"
"""On every container of a run: its run name (`docker ps --filter label=...` finds them)."""
ROLE_LABEL = f"{LABEL_PREFIX}.role"
"""On every container of a run: the role it runs."""
REPLICA_LABEL = f"{LABEL_PREFIX}.replica"
"""On a vLLM server replica beyond a host's first: its number on that host (2, 3, ...)."""
MANAGED_BY_LABEL = f"{LABEL_PREFIX}.managed-by"
MANAGED_BY = "grpo-deploy"
MANAGED = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
"""`--label` of every throw-away container the deployer starts."""
UID_LABEL = f"{LABEL_PREFIX}.uid"
GID_LABEL = f"{LABEL_PREFIX}.gid"
"""On every kit image: the identity it was built for."""
VLLM_VERSION_LABEL = f"{LABEL_PREFIX}.vllm-version"
CUDA_LABEL = f"{LABEL_PREFIX}.cuda-version"

PROJECT_PREFIX = "grpo-"
COMPOSE_BASE = "compose.yaml"
COMPOSE_NFS = "compose.nfs.yaml"
COMPOSE_BIND = "compose.bind.yaml"
COMPOSE_VERL = "compose.verl.yaml"
COMPOSE_VERL_CLUSTER = "compose.verl-cluster.yaml"
COMPOSE_INFINIBAND = "compose.infiniband.yaml"
COMPOSE_TRAINER_HOSTS = "compose.trainer-hosts.yaml"
COMPOSE_TRAINER_INFINIBAND = "compose.trainer-infiniband.yaml"
COMPOSE_FRONT = "compose.front.yaml"
COMPOSE_FILES = (COMPOSE_BASE, COMPOSE_NFS, COMPOSE_BIND, COMPOSE_VERL, COMPOSE_VERL_CLUSTER, COMPOSE_INFINIBAND,
                 COMPOSE_TRAINER_HOSTS, COMPOSE_TRAINER_INFINIBAND, COMPOSE_FRONT)

PROXY_SERVICE = "proxy"
"""The compose service of the replica proxy (beside the trainer when a run has several vLLM server replicas)."""

FRONT_SERVICE = "front"
"""The compose service of the kit's front before a server host's first vLLM replica (front-2, ... before the others),
on every server host apart from the trainer's: what other hosts reach there, asking for the run's token."""
FRONT_ARGS = "front.args"
"""The fronts' shared arguments in config/ (each front adds its own --replica on its command line)."""
RUN_TOKEN_FILE = "secret/run-token.env"
"""The run's token as GRPO_RUN_TOKEN=..., a 0600 file in a 0700 folder of the run's folder on each host (beside
render/), written by `up` and read by compose for the roles that send or check it; never part of the render."""
K8S_RUN_TOKEN_SECRET = "grpo-run-token"
"""On Kubernetes: the Secret in the run's namespace that holds the run's token (key K8S_RUN_TOKEN_KEY), created by the
user before the first apply (k8s/README.md gives the command); the front and the trainer read it as GRPO_RUN_TOKEN
through secretKeyRef. The kit renders its name only, never a value."""
K8S_RUN_TOKEN_KEY = "token"
"""The key of K8S_RUN_TOKEN_SECRET that holds the token."""

STATE_DIR = ".grpo-deploy"
"""The deployer's state folder: in the working directory for local runs, in the login user's HOME on remote hosts."""

READY_TIMEOUT_S = 900
"""How long `up` waits for the vLLM server to list the model."""
UP_RESTARTS = 2
"""Server deaths `up` recovers from (restarting the server and the trainer) before it gives up: --restarts."""


def project_name(run: str) -> str:
    """The compose project of run *run* on every host."""
    return f"{PROJECT_PREFIX}{run}"
