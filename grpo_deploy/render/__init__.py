"""Pure builders: a resolved spec -> every artifact of the run, as {relative path: text}: the engine's config and
per-host files (grpo_deploy.engines), the Kubernetes values and resolved.json. No I/O but package data (writing a
render to a folder, comparing one, reading its env files back: grpo_deploy.render.folder).

Layout of a render:
  config/            mounted read-only at /etc/grpo-deploy in every container of the run
    server.args      vLLM server arguments, one per line          (trl-async)
    server.env       server role environment (no secrets)          (trl-async)
    trainer.yaml     the trainer entrypoint's config                (trl-async)
    trainer.env      trainer role environment (no secrets)         (trl-async)
    verl-overrides.txt  Hydra overrides for verl.trainer.main_ppo   (verl)
  hosts/<host>.env   docker compose environment for that host (services to start, images, users, volume)
  hosts/<host>.gpu.yaml  compose override reserving that host's GPUs (GPU profiles only)
  k8s/params.env     values the kustomize overlays consume (images, UID/GID, mount, HF cache); grpo_deploy.render.k8s
  k8s/server.args    the server pod's vLLM arguments (vLLM on the pod's loopback; in place of config/'s) (trl-async)
  k8s/front.args     the server pod's front: the compose fronts' arguments and its --replica            (trl-async)
  k8s/placement.yaml GPU node affinity of the profile (GPU profiles only)
  k8s/admin/         the run's Namespace and NFS PersistentVolume, for a cluster admin (storage.nfs only)
  resolved.json      every effective setting with its source and reason
"""

from __future__ import annotations

import json

from grpo_deploy.render import k8s as render_k8s
from grpo_deploy.spec.resolve import Resolved, as_dict
from grpo_deploy.templating import RenderError, check_env_file

__all__ = ["RenderError", "host_files", "render_files", "server_args"]


def server_args(res: Resolved) -> list[str]:
    """The vLLM argument list (comments and blank lines dropped), e.g. for tests and Kubernetes."""
    text = render_files(res)["config/server.args"]
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def host_files(res: Resolved, config_dir: str, publish_ips: dict[str, str] | None = None) -> dict[str, str]:
    """Per-host compose environment (and GPU reservation override) for every host of the spec: the engine's."""
    files: dict[str, str] = {}
    for host in res.spec.hosts:
        files.update(res.engine_info.host_files(res, host, config_dir, publish_ips))
    return files


def render_files(res: Resolved, config_dir: str = "/etc/grpo-deploy-render/config",
                 publish_ips: dict[str, str] | None = None) -> dict[str, str]:
    """Every artifact of the run. *config_dir* is where the config/ folder will be on each host (for compose);
    *publish_ips* the addresses the deployer resolved on the hosts (`up`; the engine says which: the server's
    published IP, each Ray node's address)."""
    files = res.engine_info.config_files(res, publish_ips)
    files.update(host_files(res, config_dir, publish_ips))
    k8s = render_k8s.k8s_files(res)
    check_env_file(k8s["k8s/params.env"], "k8s/params.env")
    files.update(k8s)
    files["resolved.json"] = json.dumps(as_dict(res), indent=2, sort_keys=True, default=str) + "\n"
    return files
