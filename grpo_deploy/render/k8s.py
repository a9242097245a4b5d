"""Pure builders of what the Kubernetes overlays read from a render (k8s/ of a render): the values kustomize copies
into the workloads (params.env), the GPU placement of the profile (placement.yaml) and the cluster-scoped objects a
cluster admin applies once (admin/: the run's Namespace and its NFS PersistentVolume reserved for the run's claim)."""

from __future__ import annotations

import posixpath
from typing import Any

import yaml

from grpo_deploy.spec.resolve import Resolved

HF_CACHE_DIR = "hf-cache"  # under storage.mount: one model download shared by every pod and every restart
SHARED_CLAIM = "shared"  # the PersistentVolumeClaim of k8s/base/common
SHARED_CAPACITY = "200Gi"  # equals the claim's request in k8s/base/common/shared-pvc.yaml (the tests compare them)
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
LOCAL_CONFIG = {"config.kubernetes.io/local-config": "true"}


# A token of the kit's form (grpo_deploy.runtime.run_token: secrets.token_urlsafe(32), no newline), through a pipe:
# never on a command line, in shell history or in a file.
TOKEN_MAKER = "python3 -c 'import secrets, sys; sys.stdout.write(secrets.token_urlsafe(32))'"


def secret_commands(res: Resolved) -> list[str]:
    """The one command per Secret the run's pods cannot start without (Engine.k8s_secrets), for the run's namespace:
    each makes a random token of the kit's form and hands it to kubectl on stdin."""
    run = res.spec.run.name
    return [f"{TOKEN_MAKER} | kubectl -n {run} create secret generic {name} --from-file={key}=/dev/stdin"
            for name, key in res.engine_info.k8s_secrets(res).items()]


def pv_name(run: str) -> str:
    return f"grpo-shared-{run}"


def _labels(run: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "grpo-deploy", "app.kubernetes.io/managed-by": "grpo-deploy",
            "grpo-deploy/run": run}


def _dump(header: str, *docs: dict[str, Any]) -> str:
    return header + "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False, width=120) for d in docs)


def hf_offline(res: Resolved) -> bool:
    """A model given as a path is read from the volume: the images stay offline. A hub id must be downloaded."""
    return res.settings.model.path.startswith("/")


def gpu_products(res: Resolved) -> list[str]:
    """The profile's hardware.k8s_gpu_products (one profile per run on Kubernetes; several are merged in order)."""
    out: list[str] = []
    for profile in res.profiles.values():
        out += [p for p in profile.hardware.get("k8s_gpu_products") or [] if p not in out]
    return out


def params(res: Resolved) -> dict[str, Any]:
    ident, spec = res.main_identity, res.spec
    out: dict[str, Any] = {"run": spec.run.name, "uid": ident.uid, "gid": ident.gid, "mount": spec.storage.mount,
                           "hf_home": posixpath.join(spec.storage.mount, HF_CACHE_DIR),
                           "hf_offline": int(hf_offline(res))}
    out.update({f"image_{role}": image for role, image in sorted(res.images.items())})
    nfs = spec.storage.nfs
    if nfs is not None:
        out.update(nfs_server=nfs.server, nfs_export=nfs.export, nfs_options=nfs.options)
    out.update(res.engine_info.k8s_params(res))
    return out


def params_text(res: Resolved) -> str:
    return (f"# Values the kustomize overlays consume for run {res.spec.run.name} (rendered by grpo-deploy).\n"
            + "".join(f"{key}={value}\n" for key, value in params(res).items()))


def placement_text(res: Resolved, products: list[str]) -> str:
    """A build-time object (never applied) whose node affinity components/gpu copies into every GPU pod."""
    doc = {"apiVersion": "grpo-deploy/v1", "kind": "GpuPlacement",
           "metadata": {"name": "grpo-placement", "annotations": dict(LOCAL_CONFIG)},
           "spec": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
               {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": products}]}]}}}}
    names = ", ".join(p.name for p in res.profiles.values())
    return _dump(f"# GPU placement of run {res.spec.run.name} (rendered by grpo-deploy from profile {names}: "
                 f"hardware.k8s_gpu_products).\n", doc)


def admin_files(res: Resolved) -> dict[str, str]:
    """admin/: the run's Namespace (named after the run) and its NFS PersistentVolume, reserved with claimRef for the
    claim 'shared' in that namespace, so no other claim can take it and a re-created claim binds to it again."""
    spec = res.spec
    nfs, run = spec.storage.nfs, spec.run.name
    assert nfs is not None
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": run, "labels": _labels(run)}}
    pv = {"apiVersion": "v1", "kind": "PersistentVolume",
          "metadata": {"name": pv_name(run), "labels": _labels(run)},
          "spec": {"capacity": {"storage": SHARED_CAPACITY}, "accessModes": ["ReadWriteMany"],
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                   "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": run,
                                "name": SHARED_CLAIM},
                   "mountOptions": nfs.options.split(","), "nfs": {"server": nfs.server, "path": nfs.export}}}
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": ["namespace.yaml", "shared-pv.yaml"]}
    head = f"# Cluster-scoped objects of run {run} (rendered by grpo-deploy from storage.nfs and run.name).\n"
    return {
        "k8s/admin/kustomization.yaml": _dump(
            head + "# Applied once by a cluster admin (kubectl apply -k k8s/<overlay>/admin), before the overlay.\n",
            kustomization),
        "k8s/admin/namespace.yaml": _dump(head, namespace),
        "k8s/admin/shared-pv.yaml": _dump(
            head + "# Retain: deleting the run never deletes checkpoints. claimRef: only the run's claim binds it.\n",
            pv),
    }


def k8s_files(res: Resolved) -> dict[str, str]:
    files = {"k8s/params.env": params_text(res), **res.engine_info.k8s_config_files(res)}
    products = gpu_products(res)
    if products:
        files["k8s/placement.yaml"] = placement_text(res, products)
    if res.spec.storage.nfs is not None:
        files.update(admin_files(res))
    return files
