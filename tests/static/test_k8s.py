"""Static checks of the kustomize tree in k8s/ (no cluster: nothing here is applied anywhere).

Builds: every overlay k8s/<name>/ with a spec.yaml, every variant k8s/<name>/ without one (an overlay of an overlay,
e.g. gb10-jobset) and every overlay's admin/ kustomization (the cluster-scoped objects). For each:
  (a) generated/ is exactly what the renderer makes of the overlay's spec.yaml now;
  (b) `kubectl kustomize` builds it;
  (c) every built object validates: built-in kinds against the pinned Kubernetes OpenAPI schemas
      (kubernetes-validate, strict), RayJob and JobSet against the vendored CRD schemas of a pinned KubeRay and
      JobSet release (tests/static/crds/, jsonschema, unknown fields refused as kubectl's strict validation does)
      and the pod and Job templates inside them against the Kubernetes schemas;
  (d) policy over the built objects: non-root as the spec's UID/GID, probes, limits and ephemeral storage, pinned and
      registry-qualified images equal to the spec's, the images' entrypoint kept (args, not command), one server
      replica reachable only from the run's trainer (NetworkPolicy), secrets only by reference, the shared volume
      and the model cache at the spec's mount everywhere, offline mode as the model source says, NFS PersistentVolume
      only in admin/ and reserved for the run's claim, GPU product/arch placement as the profile says, gb10 pods
      apart and Guaranteed, Jobs with a podFailurePolicy, TRL's server timeout covering a server restart, the
      RayJob's and the JobSet's lifetimes, no placeholder left;
and behaviour checks of the shell/Python snippets in the manifests (the verl launcher and the trainer's
wait-for-server init container), run here against stand-ins for python3 and for the vLLM server.
Also: yamllint over k8s/ and ansible/ with the repository's .yamllint.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import threading
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from grpo_deploy import names, spec
from grpo_deploy.render import committed, k8s_overlay
from grpo_deploy.render import folder as render_folder
from grpo_deploy.render import k8s as render_k8s
from grpo_deploy.runtime import run_token
from grpo_deploy.spec import resolve

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
CRDS = Path(__file__).resolve().parent / "crds"
KUBERNETES_VERSION = "1.37"
EXPECTED_OVERLAYS = {"a100", "a100-rayjob", "h200", "gb10", "cpu"}
EXPECTED_VARIANTS = {"gb10-jobset": "gb10", "h200-jobset": "h200"}
CI_OVERLAYS = set(k8s_overlay.CI_OVERLAYS)
CONFIG_DIR = "/etc/grpo-deploy"
LAUNCH = "/etc/grpo-launch/verl-launch.sh"
SECRET_NAME = "grpo-deploy-secrets"
# The run's token: the one Secret a pod may not start without (the front asks every request for it).
TOKEN_REF = {"name": names.K8S_RUN_TOKEN_SECRET, "key": names.K8S_RUN_TOKEN_KEY, "optional": False}
TOKEN_READERS = {"front", "trainer", "wait-for-server"}  # the front checks it, the trainer and its wait send it
SECRET_LIKE = ("TOKEN", "API_KEY", "PASSWORD", "SECRET")
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
HEALTH_CMD = ["python3", "-m", "grpo_deploy.runtime.health", "--role", "server"]
K8S_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
# Role of each container -> the key of its image in the resolved spec.
IMAGE_OF = {"server": "server", "front": "server", "trainer": "trainer", "wait-for-server": "trainer", "verl": "verl",
            "ray-head": "verl", "ray-worker": "verl", "submitter": "verl"}
ENV_OF = {"front": "server"}  # a container whose role environment is another's: the front reads server.env
MAIN_CONTAINERS = {"server", "trainer", "verl", "ray-head", "ray-worker"}  # they load the model and use the volume
GPU_CONTAINERS = {"server", "trainer", "verl", "ray-head", "ray-worker"}
MIN_SERVER_STARTUP_S = 900  # a first model load on a Spark takes 10-15 min
CLUSTER_SCOPED = {"PersistentVolume", "Namespace", "ClusterRole", "ClusterRoleBinding", "StorageClass",
                  "RuntimeClass", "CustomResourceDefinition", "PriorityClass"}
GB10_TRAINER_PEAK_GB = 66  # the Spark field run, gradient checkpointing off (profile gb10's reason for it)
CRD_SCHEMAS = {("ray.io/v1", "RayJob"): "kuberay-v1.7.0-rayjob-v1.yaml",
               ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset-v0.12.0-jobset-v1alpha2.yaml"}


def _with(name: str) -> list[str]:
    return sorted(p.parent.name for p in K8S.glob(f"*/{name}"))


OVERLAYS = [o for o in _with("kustomization.yaml") if (K8S / o / "spec.yaml").is_file()]
VARIANTS = [o for o in _with("kustomization.yaml") if not (K8S / o / "spec.yaml").is_file()
            and o not in ("base", "components")]
ADMINS = [o for o in OVERLAYS if (K8S / o / "admin" / "kustomization.yaml").is_file()]
USER_OVERLAYS = [o for o in OVERLAYS if o not in CI_OVERLAYS]


def base_of(build_name: str) -> str:
    """The overlay (with a spec.yaml) a build comes from: itself, or the overlay a variant lists as its resource."""
    if build_name in OVERLAYS:
        return build_name
    res = yaml.safe_load((K8S / build_name / "kustomization.yaml").read_text())["resources"]
    (base,) = [r[3:] for r in res if r.startswith("../") and r[3:] in OVERLAYS]
    return base


BUILDS = OVERLAYS + VARIANTS


def _engine(overlay: str) -> str:
    return yaml.safe_load((K8S / overlay / "spec.yaml").read_text())["engine"]


TRL_BUILDS = [b for b in BUILDS if _engine(base_of(b)) == "trl-async"]
TRL_OVERLAYS = [o for o in OVERLAYS if _engine(o) == "trl-async"]
VERL_OVERLAYS = [o for o in OVERLAYS if _engine(o) == "verl"]


# --- helpers -----------------------------------------------------------------------------------------------


@cache
def resolved(build_name: str) -> resolve.Resolved:
    return resolve.resolve(spec.load(K8S / base_of(build_name) / "spec.yaml"))


def profile_of(build_name: str):
    (profile,) = {p.name: p for p in resolved(build_name).profiles.values()}.values()
    return profile


@cache
def expected_generated(build_name: str) -> dict[str, str]:
    """What `grpo-deploy k8s render` writes into k8s/<overlay>/generated/, by generated/-relative path."""
    return committed.k8s_generated(K8S / base_of(build_name))


def kustomize(path: Path) -> tuple[dict, ...]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl not found on PATH (its built-in kustomize builds the overlays)"
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc is not None)


@cache
def build(build_name: str) -> tuple[dict, ...]:
    return kustomize(K8S / build_name)


def objects(build_name: str, kind: str) -> list[dict]:
    return [o for o in build(build_name) if o["kind"] == kind]


def one(build_name: str, kind: str, name: str) -> dict:
    found = [o for o in objects(build_name, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"k8s/{build_name}: expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_templates(built: tuple[dict, ...]) -> list[tuple[str, dict]]:
    """(where, pod template) of every workload, the ones inside a JobSet or a RayJob included."""
    out = []
    for o in built:
        where = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            out.append((where, o["spec"]["template"]))
        elif o["kind"] == "JobSet":
            out += [(f"{where}/{rj['name']}", rj["template"]["spec"]["template"]) for rj in o["spec"]["replicatedJobs"]]
        elif o["kind"] == "RayJob":
            cluster = o["spec"]["rayClusterSpec"]
            out.append((f"{where}/head", cluster["headGroupSpec"]["template"]))
            out += [(f"{where}/{g['groupName']}", g["template"]) for g in cluster["workerGroupSpecs"]]
            if "submitterPodTemplate" in o["spec"]:
                out.append((f"{where}/submitter", o["spec"]["submitterPodTemplate"]))
    return out


def pod_specs(build_name: str) -> list[tuple[str, dict]]:
    out = [(where, tpl["spec"]) for where, tpl in pod_templates(build(build_name))]
    assert out, f"k8s/{build_name}: no workloads built"
    return out


def job_specs(built: tuple[dict, ...]) -> list[tuple[str, dict]]:
    """(where, Job spec) of every Job, the Jobs of a JobSet included."""
    out = [(f"Job/{o['metadata']['name']}", o["spec"]) for o in built if o["kind"] == "Job"]
    for o in built:
        if o["kind"] == "JobSet":
            out += [(f"JobSet/{o['metadata']['name']}/{rj['name']}", rj["template"]["spec"])
                    for rj in o["spec"]["replicatedJobs"]]
    return out


def containers(pod: dict, init: bool = True) -> list[dict]:
    return list(pod.get("containers", [])) + (list(pod.get("initContainers", [])) if init else [])


def all_containers(build_name: str, init: bool = True) -> list[tuple[str, dict, dict]]:
    return [(f"{where}/{c['name']}", pod, c) for where, pod in pod_specs(build_name) for c in containers(pod, init)]


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity as a float (bytes for memory, cores for CPU)."""
    s = str(text)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3}
    for suffix in sorted(units, key=len, reverse=True):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * units[suffix]
    return float(s)


def shared_claim_volume(pod: dict) -> str:
    names = [v["name"] for v in pod.get("volumes", [])
             if v.get("persistentVolumeClaim", {}).get("claimName") == "shared"]
    assert len(names) == 1, f"expected one volume on the claim 'shared', found {names}"
    return names[0]


def effective_env(build_name: str, c: dict) -> dict[str, str | None]:
    """The container's environment as Kubernetes sets it: envFrom ConfigMaps, then env (values; refs as None)."""
    env: dict[str, str | None] = {}
    for src in c.get("envFrom", []):
        ref = src.get("configMapRef")
        if ref:
            (cm,) = [o for o in objects(build_name, "ConfigMap") if o["metadata"]["name"] == ref["name"]]
            env.update(cm["data"])
    for e in c.get("env", []):
        env[e["name"]] = e.get("value")
    return env


def image_defaults() -> dict[str, str]:
    """ENV of the GPU and cpu images that the pods inherit unless they set it (the images are offline by default)."""
    out = {}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        values = {m for df in ROOT.glob("images/*/Dockerfile") for m in re.findall(rf"{name}=(\S+)", df.read_text())}
        assert len(values) == 1, f"the images disagree on {name}: {values}"
        out[name] = values.pop()
    return out


def _arg_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def server_args(build_name: str) -> list[str]:
    """vLLM's arguments as the server pod reads them (generated/server.args)."""
    return _arg_lines(expected_generated(build_name)["server.args"])


def front_args(build_name: str) -> list[str]:
    """The front's arguments as the server pod reads them (generated/front.args)."""
    return _arg_lines(expected_generated(build_name)["front.args"])


def _value(args: list[str], flag: str) -> str:
    (i,) = [i for i, arg in enumerate(args) if arg == flag]
    return args[i + 1]


def trainer_config(build_name: str) -> dict:
    return yaml.safe_load(expected_generated(build_name)["trainer.yaml"])


def verl_overrides(build_name: str) -> dict[str, str]:
    # KEY=VALUE lines, like an env file
    return render_folder.parse_env(expected_generated(build_name)["verl-overrides.txt"])


def params_env(build_name: str) -> dict[str, str]:
    return render_folder.parse_env(expected_generated(build_name)["params.env"])


def server_pod(build_name: str) -> dict:
    (tpl,) = [tpl for where, tpl in pod_templates(build(build_name))
              if tpl["metadata"]["labels"].get("grpo-deploy/role") == "server"]
    return tpl


def trainer_pod(build_name: str) -> dict:
    (tpl,) = [tpl for where, tpl in pod_templates(build(build_name))
              if tpl["metadata"]["labels"].get("grpo-deploy/role") == "trainer"]
    return tpl


@cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    """The vendored CRD schema, strict: an object with declared properties refuses other keys (kubectl's default
    field validation does the same on a real API server), except where the schema keeps unknown fields."""
    doc = yaml.safe_load((CRDS / CRD_SCHEMAS[(api_version, kind)]).read_text())

    def strict(node):
        if isinstance(node, dict):
            node = {k: strict(v) for k, v in node.items()}
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            return node
        if isinstance(node, list):
            return [strict(v) for v in node]
        return node

    schema = strict(doc["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def embedded(obj: dict) -> list[dict]:
    """Built-in objects that carry the templates inside a custom resource, for the Kubernetes schemas."""
    out = []
    for where, tpl in pod_templates((obj,)):
        out.append({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": where.replace("/", "-").lower()},
                    "template": tpl})
    if obj["kind"] == "JobSet":
        for rj in obj["spec"]["replicatedJobs"]:
            out.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": rj["name"]},
                        "spec": rj["template"]["spec"]})
    return out


def schema_errors(objs) -> list[str]:
    errors = []
    for obj in objs:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if (obj["apiVersion"], obj["kind"]) in CRD_SCHEMAS:
            for err in crd_validator(obj["apiVersion"], obj["kind"]).iter_errors(obj):
                errors.append(f"{name}: {err.message} at {'.'.join(map(str, err.absolute_path))}")
            errors += schema_errors(embedded(obj))
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{name}: {exc.message} at {'.'.join(map(str, exc.path))}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{name}: no {KUBERNETES_VERSION} schema ({exc})")
    return errors


def overlay_copy(tmp_path: Path, overlay: str, edit) -> Path:
    """k8s/ copied to tmp_path, the overlay's spec.yaml edited by *edit* (a function of the parsed spec), generated/
    re-rendered through `grpo-deploy k8s render`; the copied overlay's path."""
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    spec_file = tree / overlay / "spec.yaml"
    data = yaml.safe_load(spec_file.read_text())
    edit(data)
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    k8s_overlay.regenerate(tree / overlay)
    return tree / overlay


def real_values(data: dict) -> None:
    """What a user sets before applying: a real NFS server and images in their registry."""
    data["storage"]["nfs"]["server"] = "nfs1.lab.internal"
    for role, image in list(data["images"].items()):
        if isinstance(image, str):
            data["images"][role] = image.replace("registry.invalid/", "registry.lab.internal:5000/")


# --- discovery ---------------------------------------------------------------------------------------------


def test_expected_overlays_exist():
    assert EXPECTED_OVERLAYS <= set(OVERLAYS), f"missing overlays: {sorted(EXPECTED_OVERLAYS - set(OVERLAYS))}"
    assert {"h200", "gb10", "cpu"} <= set(TRL_OVERLAYS), f"trl-async overlays found: {TRL_OVERLAYS}"
    assert {"a100", "a100-rayjob"} <= set(VERL_OVERLAYS), f"verl overlays found: {VERL_OVERLAYS}"
    assert {v: base_of(v) for v in VARIANTS} == EXPECTED_VARIANTS
    assert set(ADMINS) == set(USER_OVERLAYS), "every NFS overlay has an admin/ kustomization, the CI one none"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_has_spec_and_generated(overlay):
    assert (K8S / overlay / "spec.yaml").is_file(), f"k8s/{overlay}/spec.yaml missing"
    assert (K8S / overlay / "generated").is_dir(), f"k8s/{overlay}/generated/ missing"


# --- (a) generated/ equals a fresh render --------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_generated_equals_fresh_render(overlay):
    expected = expected_generated(overlay)
    folder = K8S / overlay / "generated"
    actual = {p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*") if p.is_file()}
    fix = f"regenerate: grpo-deploy k8s render k8s/{overlay} (or make render-defaults)"
    assert sorted(actual) == sorted(expected), f"k8s/{overlay}/generated/ has other files than the render; {fix}"
    stale = [name for name in expected if actual[name] != expected[name]]
    assert not stale, f"k8s/{overlay}/generated/{stale} differ from a fresh render of spec.yaml; {fix}"


# --- (b) kustomize builds ------------------------------------------------------------------------------------


@pytest.mark.parametrize("build_name", BUILDS)
def test_kustomize_builds(build_name):
    built = build(build_name)
    assert built, f"k8s/{build_name} built no objects"
    for obj in built:
        assert obj.get("apiVersion") and obj.get("kind") and obj.get("metadata", {}).get("name"), obj


@pytest.mark.parametrize("build_name", BUILDS)
def test_no_placeholder_left_and_params_not_applied(build_name):
    text = yaml.safe_dump_all(build(build_name))
    assert "placeholder" not in text, f"k8s/{build_name}: a placeholder was not replaced from params.env"
    assert "nfs.invalid" not in text
    names = {(o["kind"], o["metadata"]["name"]) for o in build(build_name)}
    assert ("ConfigMap", "grpo-params") not in names, "grpo-params is build-time only (local-config)"
    assert not objects(build_name, "GpuPlacement"), "generated/placement.yaml is build-time only (local-config)"


# --- (c) schema validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("build_name", BUILDS + [f"{a}/admin" for a in ADMINS])
def test_objects_validate_against_the_pinned_schemas(build_name):
    errors = schema_errors(build(build_name))
    assert not errors, "\n".join(errors)


def test_crd_schemas_are_vendored_with_their_release():
    for (api_version, kind), name in CRD_SCHEMAS.items():
        text = (CRDS / name).read_text()
        head = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
        assert re.search(r"tag v\d+\.\d+\.\d+ \(commit [0-9a-f]{40}\)", head), f"{name}: no pinned release named"
        doc = yaml.safe_load(text)
        assert (f"{doc['group']}/{doc['version']}", doc["kind"]) == (api_version, kind)


def test_crd_validation_can_fail():
    """The strict CRD validation refuses what a real API server would: an integer rayStartParams value, an unknown
    field (a typo), a wrong enum."""
    (rayjob,) = objects("a100-rayjob", "RayJob")
    (jobset,) = objects("gb10-jobset", "JobSet")
    assert not schema_errors([rayjob]) and not schema_errors([jobset])
    bad = copy.deepcopy(rayjob)
    bad["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 4
    assert any("is not of type 'string'" in e for e in schema_errors([bad]))
    bad = copy.deepcopy(rayjob)
    bad["spec"]["shutdownAfterJobFinish"] = True
    assert any("Additional properties" in e for e in schema_errors([bad]))
    bad = copy.deepcopy(jobset)
    bad["spec"]["successPolicy"]["operator"] = "Every"
    assert any("is not one of" in e for e in schema_errors([bad]))
    bad = copy.deepcopy(jobset)
    bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    assert any("comand" in e for e in schema_errors([bad])), "the pod templates inside are validated too"


# --- (d) policy ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("build_name", BUILDS)
def test_every_container_runs_non_root_as_the_spec_uid(build_name):
    run = resolved(build_name).spec.run
    problems = []
    for where, pod in pod_specs(build_name):
        psc = pod.get("securityContext", {})
        if psc.get("fsGroup") != run.gid:
            problems.append(f"{where}: fsGroup {psc.get('fsGroup')} != run.gid {run.gid}")
        for c in containers(pod):
            csc = c.get("securityContext", {})
            eff = {**psc, **csc}
            name = f"{where}/{c['name']}"
            if eff.get("runAsNonRoot") is not True:
                problems.append(f"{name}: runAsNonRoot is not true")
            if eff.get("runAsUser") != run.uid:
                problems.append(f"{name}: runAsUser {eff.get('runAsUser')} != run.uid {run.uid}")
            if eff.get("runAsGroup") != run.gid:
                problems.append(f"{name}: runAsGroup {eff.get('runAsGroup')} != run.gid {run.gid}")
            if csc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{name}: allowPrivilegeEscalation must be false")
            if csc.get("privileged"):
                problems.append(f"{name}: privileged")
            caps = csc.get("capabilities", {})
            if "ALL" not in caps.get("drop", []) or caps.get("add"):
                problems.append(f"{name}: capabilities must drop ALL and add none, got {caps}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("build_name", BUILDS)
def test_every_container_has_requests_and_limits(build_name):
    problems = []
    for where, pod, c in all_containers(build_name):
        res = c.get("resources", {})
        for kind in ("cpu", "memory", "ephemeral-storage"):
            req, lim = res.get("requests", {}).get(kind), res.get("limits", {}).get(kind)
            if req is None or lim is None:
                problems.append(f"{where}: {kind} request and limit both needed, got {req!r}/{lim!r}")
            elif quantity(req) > quantity(lim):
                problems.append(f"{where}: {kind} request {req} > limit {lim}")
        # A Memory emptyDir (/dev/shm) is charged to the memory limit: it must fit well inside it.
        mem_dirs = {v["name"]: v["emptyDir"] for v in pod.get("volumes", [])
                    if v.get("emptyDir", {}).get("medium") == "Memory"}
        for m in c.get("volumeMounts", []):
            if m["name"] in mem_dirs:
                size = mem_dirs[m["name"]].get("sizeLimit")
                limit = res.get("limits", {}).get("memory")
                if size is None:
                    problems.append(f"{where}: Memory emptyDir {m['name']} without sizeLimit")
                elif limit is not None and quantity(size) >= quantity(limit):
                    problems.append(f"{where}: /dev/shm {size} does not fit in memory limit {limit}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("build_name", BUILDS)
def test_images_are_pinned_and_equal_the_spec(build_name):
    images = resolved(build_name).images
    problems = []
    for where, _, c in all_containers(build_name):
        image = c["image"]
        last = image.rsplit("/", 1)[-1]
        if "@sha256:" not in image and (":" not in last or last.endswith(":latest")):
            problems.append(f"{where}: image {image!r} is not pinned (no tag or :latest)")
        role = IMAGE_OF.get(c["name"])
        if role is None:
            problems.append(f"{where}: container name not known to the policy (add it to IMAGE_OF)")
        elif image != images.get(role):
            problems.append(f"{where}: image {image!r} != the spec's {role} image {images.get(role)!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("build_name", [b for b in BUILDS if base_of(b) in USER_OVERLAYS])
def test_user_overlays_name_registry_qualified_images_of_the_profile(build_name):
    """An unqualified name (grpo-deploy/vllm:TAG) resolves to the default public registry, a namespace the project
    does not own. The shipped overlays name a placeholder registry that never resolves, with the profile's tag."""
    profile_images = profile_of(build_name).images
    problems = []
    for where, _, c in all_containers(build_name):
        image = c["image"]
        registry = k8s_overlay.image_registry(image)
        if registry is None:
            problems.append(f"{where}: {image} names no registry")
        elif not image.split("@")[0].endswith("/" + profile_images[IMAGE_OF[c["name"]]]):
            problems.append(f"{where}: {image} is not the profile's {profile_images[IMAGE_OF[c['name']]]}")
    assert not problems, "\n".join(problems)


def test_an_image_digest_reaches_every_container(tmp_path):
    digest = "sha256:" + "ab" * 32

    def pin(data):
        real_values(data)
        for role in ("server", "trainer"):
            data["images"][role] += "@" + digest

    built = kustomize(overlay_copy(tmp_path, "gb10", pin))
    images = {c["image"] for _, tpl in pod_templates(built) for c in containers(tpl["spec"])}
    assert images == {f"registry.lab.internal:5000/grpo-deploy/{n}:0.1.0-cu130-arm64@{digest}"
                      for n in ("vllm", "trainer")}, images


def test_images_keep_tini_as_their_entrypoint():
    """What args-not-command keeps: every image starts tini as PID 1 (it reaps Ray's and vLLM's children)."""
    dockerfiles = sorted(ROOT.glob("images/*/Dockerfile"))
    assert len(dockerfiles) >= 4
    for df in dockerfiles:
        text = df.read_text()
        entries = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)
        if not entries:  # the trainer image: FROM the server image, whose ENTRYPOINT it inherits
            assert re.search(r"^ARG BASE_IMAGE=grpo-deploy/vllm:", text, re.M), f"{df}: no ENTRYPOINT, no kit base"
            continue
        assert len(entries) == 1 and json.loads(entries[0])[0] == "/usr/bin/tini", f"{df}: ENTRYPOINT {entries}"


@pytest.mark.parametrize("build_name", BUILDS)
def test_containers_keep_the_image_entrypoint(build_name):
    """args, not command: a command replaces the image's ENTRYPOINT (tini, then the umask wrapper). Ray containers
    are the exception KubeRay forces: their command is the image's entrypoint spelled out, and KubeRay is told to
    keep it (ray.io/overwrite-container-cmd), with args that run the `ray start` it generated."""
    (verl_entry,) = re.findall(r"^ENTRYPOINT (\[.*\])$", (ROOT / "images/verl/Dockerfile").read_text(), re.M)
    problems = []
    for where, tpl in pod_templates(build(build_name)):
        for c in containers(tpl["spec"]):
            if c["name"] in ("ray-head", "ray-worker"):
                if tpl["metadata"].get("annotations", {}).get("ray.io/overwrite-container-cmd") != "true":
                    problems.append(f"{where}/{c['name']}: without ray.io/overwrite-container-cmd KubeRay replaces "
                                    "the command with its own bash")
                if c.get("command", [])[:3] != json.loads(verl_entry):
                    problems.append(f"{where}/{c['name']}: command {c.get('command')} does not start with the image's "
                                    f"ENTRYPOINT {verl_entry}")
                if "$KUBERAY_GEN_RAY_START_CMD" not in " ".join(c.get("args", [])):
                    problems.append(f"{where}/{c['name']}: args do not run KubeRay's generated ray start")
            elif "command" in c:
                problems.append(f"{where}/{c['name']}: command {c['command']} replaces the image's tini entrypoint")
    assert not problems, "\n".join(problems)


def _want_workloads(build_name: str) -> list[str]:
    if build_name in VARIANTS:
        return ["JobSet/run"]
    if build_name in TRL_OVERLAYS:
        return ["Deployment/server", "Job/trainer"]
    return ["Job/verl"] if int(verl_overrides(build_name)["trainer.nnodes"]) == 1 else ["RayJob/verl"]


@pytest.mark.parametrize("build_name", BUILDS)
def test_workloads_of_the_engine(build_name):
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in build(build_name) if o["kind"] in
                   ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "HorizontalPodAutoscaler",
                    "JobSet", "RayJob", "RayCluster"))
    want = _want_workloads(build_name)
    assert kinds == want, f"k8s/{build_name}: workloads {kinds}, expected {want}"


@pytest.mark.parametrize("overlay", TRL_OVERLAYS)
def test_exactly_one_server_replica(overlay):
    dep = one(overlay, "Deployment", "server")
    assert dep["spec"].get("replicas") == 1, "TRL talks to one base URL: exactly one vLLM replica"
    assert dep["spec"].get("strategy", {}).get("type") == "Recreate", "a rolling update would run two servers"
    assert not objects(overlay, "HorizontalPodAutoscaler")


def _startup_budget_s(server: dict) -> int:
    startup = server["startupProbe"]
    return startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)


def _pod_container(tpl: dict, name: str) -> dict:
    (c,) = [c for c in tpl["spec"]["containers"] if c["name"] == name]
    return c


@pytest.mark.parametrize("build_name", TRL_BUILDS)
def test_server_probes(build_name):
    """vLLM listens on the pod's loopback: its three probes are exec inside its container and ask its loopback port;
    readiness is `/v1/models lists the served model`, liveness vLLM's /health. The front is ready when the model is
    listed through it (the health check sends the run's token); no probe of the pod is an httpGet (the front
    answers 401 without the token, and a token in a probe's header would be in the manifest)."""
    tpl = server_pod(build_name)
    server, front = _pod_container(tpl, "server"), _pod_container(tpl, "front")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in server, f"server has no {probe}"
        assert set(server[probe]) & {"exec", "httpGet", "tcpSocket", "grpc"} == {"exec"}, \
            f"server {probe}: vLLM listens on loopback, the kubelet reaches the pod's address: exec only"
        assert server[probe]["exec"]["command"][:len(HEALTH_CMD)] == HEALTH_CMD
    assert server["readinessProbe"]["exec"]["command"] == HEALTH_CMD, \
        "readiness must be `/v1/models lists the served model` (grpo_deploy.runtime.health), not /health"
    assert server["livenessProbe"]["exec"]["command"] == [*HEALTH_CMD, "--live"], "liveness asks vLLM's /health"
    assert not server.get("ports"), "vLLM's container publishes no port: it listens on the pod's loopback"
    # The health command reads the served model and port from the environment (server.env via envFrom, the port
    # replaced by vLLM's loopback port in the server container).
    model = resolved(build_name).settings.model.served_name
    env = effective_env(build_name, server)
    assert env.get("GRPO_SERVED_MODEL") == model
    assert env.get("GRPO_SERVER_PORT") == _value(server_args(build_name), "--port"), \
        "the server's probes would ask another port than vLLM's"
    assert front["readinessProbe"]["exec"]["command"] == HEALTH_CMD, "the front is ready when the model is listed"
    front_env = effective_env(build_name, front)
    (port,) = [p["containerPort"] for p in front["ports"] if p["name"] == "http"]
    assert front_env.get("GRPO_SERVED_MODEL") == model and front_env.get("GRPO_SERVER_PORT") == str(port)
    assert "GRPO_RUN_TOKEN" in front_env, "the front's readiness check must send the run's token"
    for c in tpl["spec"]["containers"]:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "httpGet" not in c.get(probe, {}), f"{c['name']} {probe}: an httpGet probe"
    budget = _startup_budget_s(server)
    assert budget >= MIN_SERVER_STARTUP_S, (f"startupProbe allows {budget} s, less than a model load "
                                            f"({MIN_SERVER_STARTUP_S} s)")


@pytest.mark.parametrize("build_name", TRL_BUILDS)
def test_the_front_stands_before_vllm_on_loopback(build_name):
    """The server pod: vLLM bound to 127.0.0.1 on its own port, the front (the kit's replica proxy, the server's
    image, the compose fronts' arguments with --require-token) on the Service's port, its one replica vLLM's
    loopback address."""
    tpl = server_pod(build_name)
    front = _pod_container(tpl, "front")
    vllm, fargs = server_args(build_name), front_args(build_name)
    port = resolved(build_name).settings.vllm.port
    assert _value(vllm, "--host") == "127.0.0.1", "vLLM must listen on the pod's loopback only"
    loopback = int(_value(vllm, "--port"))
    assert loopback != port and str(loopback) == params_env(build_name)["vllm_port"]
    assert front["args"] == ["python3", "-m", "grpo_deploy.runtime.serving.proxy", f"@{CONFIG_DIR}/front.args"]
    assert "command" not in front, "args, not command: the image's entrypoint (tini) stays in front"
    assert _value(fargs, "--listen") == f"0.0.0.0:{port}" and "--require-token" in fargs
    assert [a for i, a in enumerate(fargs) if i and fargs[i - 1] == "--replica"] == [f"http://127.0.0.1:{loopback}"]
    assert _value(fargs, "--adapter-dir") == posixpath.join(trainer_config(build_name)["adapters"]["dir"],
                                                            ".vllm_lora")
    assert [p["containerPort"] for p in front["ports"]] == [port]


@pytest.mark.parametrize("build_name", TRL_BUILDS)
def test_the_run_token_reaches_the_front_and_the_trainer_from_the_users_secret(build_name):
    """GRPO_RUN_TOKEN from the Secret grpo-run-token (key token, not optional: the pod does not start without it) in
    the front, the trainer and its wait; nowhere else, and never a value."""
    readers = set()
    for where, _, c in all_containers(build_name):
        for e in c.get("env", []):
            if e["name"] == "GRPO_RUN_TOKEN":
                assert "value" not in e and e.get("valueFrom") == {"secretKeyRef": TOKEN_REF}, f"{where}: {e}"
                readers.add(c["name"])
    assert readers == TOKEN_READERS, f"GRPO_RUN_TOKEN reaches {sorted(readers)}, expected {sorted(TOKEN_READERS)}"


@pytest.mark.parametrize("build_name", BUILDS)
def test_no_run_token_value_anywhere_in_the_build(build_name):
    """The kit renders the Secret's name, never a token: nothing in the built objects or in generated/ has the
    form of a token (runtime.run_token), carries GRPO_RUN_TOKEN=... or an Authorization header."""
    texts = [yaml.safe_dump(list(build(build_name)))] + list(expected_generated(build_name).values())
    for text in texts:
        assert not re.search(r"GRPO_RUN_TOKEN\s*=", text)
        assert "Bearer " not in text and "httpHeaders" not in text
        assert not [w for w in re.findall(r"[A-Za-z0-9_-]{43}", text) if re.search(r"[0-9]", w)
                    and re.search(r"[A-Z]", w) and re.search(r"[a-z]", w)], "a token-shaped value in the build"


@pytest.mark.parametrize("build_name", TRL_BUILDS)
def test_trl_server_timeout_covers_a_server_restart(build_name):
    """A server restarted mid-run (OOM, node drain) is ready again within its startup budget; TRL must wait at least
    that long before it gives up, or the trainer dies while Kubernetes is still bringing the server back."""
    (server,) = [c for c in server_pod(build_name)["spec"]["containers"] if c["name"] == "server"]
    timeout = trainer_config(build_name)["async_grpo"]["vllm_server_timeout"]
    assert timeout >= _startup_budget_s(server), (
        f"TRL's vllm_server_timeout {timeout} s < the server's startup budget {_startup_budget_s(server)} s")


@pytest.mark.parametrize("build_name", TRL_BUILDS)
def test_trainer_reaches_the_server_service(build_name):
    url = urlsplit(trainer_config(build_name)["async_grpo"]["vllm_server_base_url"])
    svc = one(build_name, "Service", url.hostname)
    (svc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    tpl = server_pod(build_name)
    assert svc["spec"]["selector"].items() <= tpl["metadata"]["labels"].items(), "the Service misses the server"
    (front,) = [c for c in tpl["spec"]["containers"] if c["name"] == "front"]
    (port,) = [p for p in front["ports"]
               if p["name"] == svc_port["targetPort"] or p["containerPort"] == svc_port["targetPort"]]
    listen = _value(front_args(build_name), "--listen")
    assert listen == f"0.0.0.0:{port['containerPort']}", "the Service's target is not the front's --listen port"
    assert url.port == port["containerPort"], "the trainer asks the Service on another port than the front's"
    (init,) = [c for c in trainer_pod(build_name)["spec"]["initContainers"] if c["name"] == "wait-for-server"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["GRPO_SERVED_MODEL"] == resolved(build_name).settings.model.served_name


def _selects(selector: dict, labels: dict) -> bool:
    return bool(selector.get("matchLabels")) and selector["matchLabels"].items() <= labels.items() and \
        not selector.get("matchExpressions")


@pytest.mark.parametrize("build_name", TRL_BUILDS)
def test_server_reachable_only_from_the_runs_trainer(build_name):
    """vLLM's dev-mode and runtime-LoRA endpoints have no authentication: only this run's trainer pods may connect,
    only on the server pod's port, which is the front's (vLLM's own is on the pod's loopback)."""
    server, trainer = server_pod(build_name), trainer_pod(build_name)
    run = resolved(build_name).spec.run.name
    port = int(_value(front_args(build_name), "--listen").rsplit(":", 1)[1])
    policies = [p for p in objects(build_name, "NetworkPolicy")
                if _selects(p["spec"]["podSelector"], server["metadata"]["labels"])]
    assert len(policies) == 1, f"expected one NetworkPolicy selecting the server pods, found {len(policies)}"
    spec_ = policies[0]["spec"]
    assert spec_["podSelector"]["matchLabels"].get("grpo-deploy/run") == run, "the policy must name this run"
    assert "Ingress" in spec_.get("policyTypes", []), "the policy must restrict ingress"
    assert spec_.get("ingress"), "an empty ingress list would refuse the trainer too"
    for rule in spec_["ingress"]:
        assert rule.get("from"), "a rule without 'from' admits every pod"
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, f"only pods of this namespace may be peers, got {sorted(peer)}"
            assert _selects(peer["podSelector"], trainer["metadata"]["labels"]), "the peer is not the trainer"
            assert not _selects(peer["podSelector"], server["metadata"]["labels"])
            assert peer["podSelector"]["matchLabels"].get("grpo-deploy/run") == run, "another run's trainer admitted"
        assert [(p.get("protocol", "TCP"), p.get("port")) for p in rule.get("ports", [])] == [("TCP", port)], \
            f"rule ports {rule.get('ports')} != the server port {port}"


@pytest.mark.parametrize("build_name", BUILDS)
def test_jobs_have_a_pod_failure_policy(build_name):
    """backoffLimit alone spends retries on preemptions and retries a config error; exit 2 is the kit's bad input."""
    jobs = job_specs(build(build_name))
    if _engine(base_of(build_name)) == "verl" and int(verl_overrides(build_name)["trainer.nnodes"]) > 1:
        assert not jobs, "multi-node verl is a RayJob"
        return
    assert jobs
    problems = []
    for where, job in jobs:
        rules = job.get("podFailurePolicy", {}).get("rules", [])
        main = [c["name"] for c in job["template"]["spec"]["containers"]]
        if job["template"]["spec"].get("restartPolicy") != "Never":
            problems.append(f"{where}: podFailurePolicy needs restartPolicy Never")
        if not any(r["action"] == "Ignore" and {"type": "DisruptionTarget"} in
                   [{"type": c["type"]} for c in r.get("onPodConditions", [])] for r in rules):
            problems.append(f"{where}: a preemption/drain (DisruptionTarget) must not count as a failure")
        if not any(r["action"] == "FailJob" and r.get("onExitCodes", {}).get("operator") == "In"
                   and 2 in r["onExitCodes"].get("values", []) and r["onExitCodes"].get("containerName") in main
                   for r in rules):
            problems.append(f"{where}: exit 2 (bad input) of the main container must fail the Job, not retry")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("build_name", BUILDS)
def test_secrets_only_by_reference(build_name):
    assert not objects(build_name, "Secret"), "no Secret objects in the build: secrets are created by the user"
    problems = []
    for where, _, c in all_containers(build_name):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None and e["name"] == "GRPO_RUN_TOKEN":
                if ref != TOKEN_REF:
                    problems.append(f"{where}: GRPO_RUN_TOKEN refers to {ref}, expected {TOKEN_REF}")
            elif ref is not None:
                if ref.get("name") != SECRET_NAME or ref.get("optional") is not True:
                    problems.append(f"{where}: env {e['name']} refers to {ref}, expected {SECRET_NAME} optional")
            elif any(word in e["name"].upper() for word in SECRET_LIKE):
                problems.append(f"{where}: env {e['name']} looks like a secret but is not a secretKeyRef")
        for src in c.get("envFrom", []):
            if "secretRef" in src and (src["secretRef"].get("name") != SECRET_NAME
                                       or not src["secretRef"].get("optional")):
                problems.append(f"{where}: envFrom {src}")
    # Nothing secret-looking in the ConfigMaps either: neither as a key nor as a NAME=value line of a file.
    for cm in objects(build_name, "ConfigMap"):
        for key, value in (cm.get("data") or {}).items():
            names = [key] + [ln.split("=", 1)[0] for ln in str(value).splitlines() if "=" in ln]
            for name in names:
                if ENV_NAME.fullmatch(name) and any(word in name for word in SECRET_LIKE):
                    problems.append(f"ConfigMap {cm['metadata']['name']}: {key} carries {name}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("build_name", BUILDS)
def test_shared_volume_at_the_spec_mount_in_every_container(build_name):
    mount = resolved(build_name).spec.storage.mount
    assert one(build_name, "PersistentVolumeClaim", "shared")
    problems = []
    for where, pod in pod_specs(build_name):
        if where.endswith("/submitter"):
            continue  # runs `ray job submit` only
        vol = shared_claim_volume(pod)
        for c in containers(pod):
            paths = [m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] == vol]
            is_init = c in pod.get("initContainers", [])
            if paths != [mount] and not (is_init and not paths):
                problems.append(f"{where}/{c['name']}: shared volume at {paths}, expected [{mount!r}]")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("build_name", BUILDS)
def test_model_cache_on_the_shared_volume_and_offline_as_the_model_source_says(build_name):
    """HF_HOME on the shared volume: one download, kept across restarts (not in the container layer). The images are
    offline by default: a hub id must turn that off, a path must leave it on."""
    res = resolved(build_name)
    mount, hub = res.spec.storage.mount, not res.settings.model.path.startswith("/")
    defaults = image_defaults()
    assert defaults == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, defaults
    problems = []
    for where, _, c in all_containers(build_name):
        if c["name"] not in MAIN_CONTAINERS:
            continue
        env = effective_env(build_name, c)
        home = env.get("HF_HOME")
        if not home or posixpath.commonpath([home, mount]) != mount or home == mount:
            problems.append(f"{where}: HF_HOME {home!r} is not a folder on the shared volume {mount}")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            value = env.get(name, defaults[name])
            if value != ("0" if hub else "1"):
                problems.append(f"{where}: {name}={value} but the model {res.settings.model.path} is "
                                f"{'a hub id' if hub else 'a path'}")
    assert not problems, "\n".join(problems)


def test_verl_goes_offline_for_a_model_path(tmp_path):
    def local_model(data):
        data["model"]["path"] = "/shared/models/qwen2.5-3b"
        data["model"]["served_name"] = "qwen2.5-3b"

    built = kustomize(overlay_copy(tmp_path, "a100", local_model))
    (job,) = [o for o in built if o["kind"] == "Job"]
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["HF_HOME"] == "/shared/hf-cache"


@pytest.mark.parametrize("build_name", BUILDS)
def test_config_mounted_read_only_with_the_rendered_files(build_name):
    expected = {k: v for k, v in expected_generated(build_name).items()
                if k.startswith(("server.", "front.", "trainer.", "verl-"))}
    problems = []
    for where, pod in pod_specs(build_name):
        if where.endswith("/submitter"):
            continue
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        for c in containers(pod):
            mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == CONFIG_DIR]
            if len(mounts) != 1 or mounts[0].get("readOnly") is not True:
                problems.append(f"{where}/{c['name']}: {CONFIG_DIR} must be mounted once, read-only")
                continue
            cm_name = vols[mounts[0]["name"]]["configMap"]["name"]
            (cm,) = [o for o in objects(build_name, "ConfigMap") if o["metadata"]["name"] == cm_name]
            data = cm["data"]
            for name, text in expected.items():
                if data.get(name) != text:
                    problems.append(f"{where}/{c['name']}: {CONFIG_DIR}/{name} is not the rendered file")
            for arg in c.get("command", []) + c.get("args", []):
                for token in str(arg).replace('"', " ").replace("=", " ").split():
                    if token.startswith(CONFIG_DIR + "/") and token[len(CONFIG_DIR) + 1:] not in data:
                        problems.append(f"{where}/{c['name']}: uses {token}, absent from ConfigMap {cm_name}")
            for src in c.get("envFrom", []):
                ref = src.get("configMapRef")
                if ref:
                    (env_cm,) = [o for o in objects(build_name, "ConfigMap") if o["metadata"]["name"] == ref["name"]]
                    role_env = f"{ENV_OF.get(c['name'], c['name'])}.env"
                    if env_cm["data"] != render_folder.parse_env(expected[role_env]):
                        problems.append(f"{where}/{c['name']}: env ConfigMap != rendered {role_env}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("build_name", BUILDS)
def test_every_configmap_a_pod_names_is_built(build_name):
    """Hash-suffixed ConfigMap names must reach the templates inside a JobSet too (kustomize renames them only where
    it knows the field); a RayJob's ConfigMaps keep their names."""
    names = {o["metadata"]["name"] for o in objects(build_name, "ConfigMap")}
    missing = [f"{where}: {v['configMap']['name']}" for where, pod in pod_specs(build_name)
               for v in pod.get("volumes", []) if "configMap" in v and v["configMap"]["name"] not in names]
    missing += [f"{where}/{c['name']}: {s['configMapRef']['name']}" for where, pod, c in all_containers(build_name)
                for s in c.get("envFrom", []) if "configMapRef" in s and s["configMapRef"]["name"] not in names]
    assert not missing, "ConfigMaps named but not built:\n" + "\n".join(missing)


@pytest.mark.parametrize("build_name", BUILDS)
def test_namespaced_objects_only_in_the_runs_namespace(build_name):
    """A namespace admin applies the overlay: nothing cluster-scoped in it (the PersistentVolume is in admin/), and
    every object in the namespace named after the run, the one the PersistentVolume's claimRef names."""
    run = resolved(build_name).spec.run.name
    problems = [f"{o['kind']}/{o['metadata']['name']}: cluster-scoped, belongs in admin/"
                for o in build(build_name) if o["kind"] in CLUSTER_SCOPED]
    problems += [f"{o['kind']}/{o['metadata']['name']}: namespace {o['metadata'].get('namespace')!r} != {run!r}"
                 for o in build(build_name) if o["kind"] not in CLUSTER_SCOPED
                 and o["metadata"].get("namespace") != run]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shared_storage_follows_the_spec(overlay):
    res = resolved(overlay)
    nfs, run = res.spec.storage.nfs, res.spec.run.name
    pvc = one(overlay, "PersistentVolumeClaim", "shared")
    if nfs is None:
        assert overlay not in ADMINS, "no storage.nfs in the spec, yet an admin/ kustomization"
        assert "volumeName" not in pvc["spec"]
        return
    admin = kustomize(K8S / overlay / "admin")
    assert sorted(o["kind"] for o in admin) == ["Namespace", "PersistentVolume"], "admin/ holds the namespace and PV"
    (ns,) = [o for o in admin if o["kind"] == "Namespace"]
    (pv,) = [o for o in admin if o["kind"] == "PersistentVolume"]
    assert ns["metadata"]["name"] == run == pvc["metadata"]["namespace"]
    assert pv["spec"]["nfs"] == {"server": nfs.server, "path": nfs.export}, \
        f"PV nfs {pv['spec']['nfs']} != spec storage.nfs server/export ({nfs.server}, {nfs.export})"
    assert pv["spec"].get("mountOptions") == nfs.options.split(","), "PV mountOptions != spec storage.nfs.options"
    assert pvc["spec"].get("volumeName") == pv["metadata"]["name"]
    ref = pv["spec"].get("claimRef") or {}
    assert (ref.get("namespace"), ref.get("name")) == (run, "shared"), \
        f"claimRef {ref}: the PV must be reserved for this run's claim (no other claim may take it)"
    assert "uid" not in ref, "a claimRef with a uid binds to one claim object only: a re-created claim stays Pending"
    assert pvc["spec"].get("storageClassName") == "" == pv["spec"].get("storageClassName")
    assert "ReadWriteMany" in pv["spec"]["accessModes"] and "ReadWriteMany" in pvc["spec"]["accessModes"]
    assert quantity(pv["spec"]["capacity"]["storage"]) >= quantity(pvc["spec"]["resources"]["requests"]["storage"])
    assert pv["spec"].get("persistentVolumeReclaimPolicy") == "Retain", "deleting a run must not delete checkpoints"


@pytest.mark.parametrize("build_name", BUILDS)
def test_gpu_and_arch_placement_follow_the_profile(build_name):
    profile = profile_of(build_name)
    arches = {K8S_ARCH[a] for a in profile.hardware.get("arch", [])}
    products = profile.hardware.get("k8s_gpu_products") or []
    problems = []
    for where, pod in pod_specs(build_name):
        selector = pod.get("nodeSelector", {})
        if len(arches) == 1 and selector.get("kubernetes.io/arch") != next(iter(arches)):
            problems.append(f"{where}: nodeSelector arch {selector.get('kubernetes.io/arch')!r}, profile says {arches}")
        for c in pod["containers"]:
            gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            if profile.accelerator == "cuda" and c["name"] in GPU_CONTAINERS:
                per_node = verl_overrides(build_name)["trainer.n_gpus_per_node"] if _engine(base_of(build_name)) \
                    == "verl" else 1
                if gpus is None or int(gpus) != int(per_node):
                    problems.append(f"{where}/{c['name']}: nvidia.com/gpu {gpus}, expected {per_node}")
                if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])):
                    problems.append(f"{where}: no toleration for the nvidia.com/gpu taint")
                terms = (pod.get("affinity", {}).get("nodeAffinity", {})
                         .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
                wanted = {"key": render_k8s.GPU_PRODUCT_LABEL, "operator": "In", "values": products}
                if not products or not terms or any(wanted not in t.get("matchExpressions", []) for t in terms):
                    problems.append(f"{where}: GPU pods must require {render_k8s.GPU_PRODUCT_LABEL} in {products} "
                                    f"(the profile's GPU), got {terms}")
            elif gpus is not None:
                problems.append(f"{where}/{c['name']}: no GPU expected here, yet nvidia.com/gpu={gpus}")
        for c in pod.get("initContainers", []):
            if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {}):
                problems.append(f"{where}/{c['name']}: an init container must not hold a GPU")
    assert not problems, "\n".join(problems)


def _unified(build_name: str) -> bool:
    return bool(profile_of(build_name).hardware.get("unified_memory"))


UNIFIED_BUILDS = [b for b in TRL_BUILDS if _unified(b)]


@pytest.mark.parametrize("build_name", UNIFIED_BUILDS)
def test_unified_memory_server_and_trainer_never_share_a_node(build_name):
    """On DGX Sparks one GPU per pod does not keep them apart (time-slicing advertises several per node)."""
    server, trainer = server_pod(build_name), trainer_pod(build_name)
    for me, other in ((server, trainer), (trainer, server)):
        role = me["metadata"]["labels"]["grpo-deploy/role"]
        terms = me["spec"].get("affinity", {}).get("podAntiAffinity", {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", [])
        ok = [t for t in terms if t.get("topologyKey") == "kubernetes.io/hostname"
              and _selects(t.get("labelSelector", {}), other["metadata"]["labels"])
              and not _selects(t.get("labelSelector", {}), me["metadata"]["labels"])
              and "grpo-deploy/run" in t.get("matchLabelKeys", [])]
        assert ok, f"{role}: no required anti-affinity to its run's {other['metadata']['labels']['grpo-deploy/role']}"


@pytest.mark.parametrize("build_name", UNIFIED_BUILDS)
def test_unified_memory_pods_are_guaranteed_with_the_stated_sizes(build_name):
    """Guaranteed QoS (requests = limits everywhere, init containers too): nothing else is packed onto the unified
    memory and the pods are the last eviction candidates. Memory covers what the profile says each side takes."""
    res, hw = resolved(build_name), profile_of(build_name).hardware
    need = {"server": res.settings.vllm.gpu_memory_utilization * hw["memory_gb_per_gpu"] * 1e9,
            "trainer": GB10_TRAINER_PEAK_GB * 1e9}
    for tpl in (server_pod(build_name), trainer_pod(build_name)):
        pod, role = tpl["spec"], tpl["metadata"]["labels"]["grpo-deploy/role"]
        shm = sum(quantity(v["emptyDir"].get("sizeLimit", 0)) for v in pod.get("volumes", [])
                  if v.get("emptyDir", {}).get("medium") == "Memory")
        for c in containers(pod):
            res_ = c.get("resources", {})
            for kind in ("cpu", "memory"):
                req, lim = res_.get("requests", {}).get(kind), res_.get("limits", {}).get(kind)
                assert req is not None and req == lim, f"{role}/{c['name']}: {kind} request {req} != limit {lim}"
        (main,) = [c for c in pod["containers"] if c["name"] == role]
        memory = quantity(main["resources"]["limits"]["memory"])
        assert memory >= need[role] + shm, f"{role}: {memory / 2**30:.0f} GiB < stated need + /dev/shm"
        pod_memory = sum(quantity(c["resources"]["limits"]["memory"]) for c in pod["containers"])
        assert pod_memory <= 0.85 * hw["host_memory_gb"] * 1e9, \
            f"{role}: {pod_memory / 2**30:.0f} GiB leaves the node no room"


@pytest.mark.parametrize("build_name", BUILDS)
def test_objects_carry_the_run_and_use_the_tokenless_service_account(build_name):
    run = resolved(build_name).spec.run.name
    sa = one(build_name, "ServiceAccount", "grpo-deploy")
    assert sa.get("automountServiceAccountToken") is False
    problems = [f"{o['kind']}/{o['metadata']['name']}: grpo-deploy/run label != {run!r}"
                for o in build(build_name) if o["kind"] != "ConfigMap"
                and o["metadata"].get("labels", {}).get("grpo-deploy/run") != run]
    for where, tpl in pod_templates(build(build_name)):
        pod = tpl["spec"]
        if pod.get("serviceAccountName") != "grpo-deploy" or pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: must use ServiceAccount grpo-deploy without a mounted token")
        if pod.get("enableServiceLinks") is not False:
            problems.append(f"{where}: enableServiceLinks must be false (Service env vars can clash with vLLM's)")
        if tpl["metadata"]["labels"].get("grpo-deploy/run") != run:
            problems.append(f"{where}: pod template run label != {run!r}")
    assert not problems, "\n".join(problems)


def test_runtime_class_component_reaches_every_pod(tmp_path):
    """components/runtime-class-nvidia: for clusters whose runtime is not NVIDIA's by default (k3s, RKE2)."""
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    for overlay in ("gb10", "a100-rayjob"):
        kfile = tree / overlay / "kustomization.yaml"
        data = yaml.safe_load(kfile.read_text())
        data["components"].append("../components/runtime-class-nvidia")
        kfile.write_text(yaml.safe_dump(data, sort_keys=False))
        pods = pod_templates(kustomize(tree / overlay))
        gpu_pods = [(w, t) for w, t in pods if not w.endswith("/submitter")]
        assert gpu_pods and all(t["spec"].get("runtimeClassName") == "nvidia" for _, t in gpu_pods), \
            [(w, t["spec"].get("runtimeClassName")) for w, t in pods]
    assert all("runtimeClassName" not in t["spec"] for _, t in pod_templates(build("gb10"))), "optional: off by default"


# --- lifetimes: the JobSet variants and the RayJob ------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_jobset_ties_the_server_to_the_trainer(variant):
    (js,) = objects(variant, "JobSet")
    jobs = {rj["name"]: rj for rj in js["spec"]["replicatedJobs"]}
    assert sorted(jobs) == ["server", "trainer"] and all(rj.get("replicas", 1) == 1 for rj in jobs.values())
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["trainer"]}, \
        "the trainer's success must end the JobSet (which then deletes the server's Job)"
    assert js["spec"].get("failurePolicy", {}).get("maxRestarts", 0) >= 1, "a dead server must fail the run"
    assert js["spec"].get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder", "server first"
    assert js["spec"]["replicatedJobs"][0]["name"] == "server"
    base = base_of(variant)
    assert jobs["server"]["template"]["spec"]["template"]["spec"]["containers"] == \
        one(base, "Deployment", "server")["spec"]["template"]["spec"]["containers"], "the server pod is the overlay's"
    assert jobs["trainer"]["template"]["spec"]["template"]["spec"]["containers"] == \
        one(base, "Job", "trainer")["spec"]["template"]["spec"]["containers"], "the trainer pod is the overlay's"


@pytest.mark.parametrize("overlay", [o for o in VERL_OVERLAYS if int(verl_overrides(o)["trainer.nnodes"]) > 1])
def test_rayjob_runs_the_launcher_on_a_cluster_of_nnodes(overlay):
    (rj,) = objects(overlay, "RayJob")
    s, cluster = rj["spec"], rj["spec"]["rayClusterSpec"]
    nnodes, per_node = (int(verl_overrides(overlay)[k]) for k in ("trainer.nnodes", "trainer.n_gpus_per_node"))
    (workers,) = cluster["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == nnodes - 1, \
        f"one head + {nnodes - 1} workers = trainer.nnodes {nnodes}"
    assert s["entrypoint"] == f"sh {LAUNCH}", "the entrypoint is the launcher the single-node Job runs"
    assert s.get("shutdownAfterJobFinishes") is True and s.get("ttlSecondsAfterFinished", 0) > 0, \
        "the Ray cluster (and its GPUs) must go when the job ends"
    for group in (cluster["headGroupSpec"], workers):
        params = group["rayStartParams"]
        (c,) = group["template"]["spec"]["containers"]
        assert all(isinstance(v, str) for v in params.values()), f"rayStartParams values must be strings: {params}"
        assert params["num-gpus"] == str(per_node) == str(c["resources"]["limits"]["nvidia.com/gpu"])
        assert quantity(params["num-cpus"]) == quantity(c["resources"]["limits"]["cpu"]), \
            "Ray must count the CPUs the container may use (too few hangs verl at placement)"
        assert quantity(params["num-cpus"]) >= 3 * per_node + (20 if group is cluster["headGroupSpec"] else 0)
        assert not any(LAUNCH in a or "main_ppo" in a for a in c.get("command", []) + c.get("args", [])), \
            "a Job command in a Ray pod would run before `ray start`"
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == params_env(overlay)["socket_ifname"], \
            "NCCL and Gloo use the interface the render names, in every Ray pod, before `ray start`"
    lock = (ROOT / "images/verl/requirements-amd64.lock").read_text()
    assert f"ray=={cluster['rayVersion']} " in lock, f"rayVersion {cluster['rayVersion']} != the verl image's ray"


# --- the door: grpo-deploy k8s check ---------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", USER_OVERLAYS)
def test_check_refuses_the_shipped_placeholders(overlay):
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "k8s", "check", f"k8s/{overlay}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and not proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "storage.nfs.server 192.0.2.10" in proc.stderr, proc.stderr


def test_check_passes_an_overlay_with_real_values(tmp_path):
    path = overlay_copy(tmp_path, "h200", real_values)
    assert k8s_overlay.problems(path) == []
    built = kustomize(path)
    assert not schema_errors(built)
    (admin_pv,) = [o for o in kustomize(path / "admin") if o["kind"] == "PersistentVolume"]
    assert admin_pv["spec"]["nfs"]["server"] == "nfs1.lab.internal"


# --- behaviour of the snippets inside the manifests ----------------------------------------------------------


@pytest.mark.parametrize("overlay", VERL_OVERLAYS)
def test_verl_launcher_passes_every_override_verbatim(overlay, tmp_path):
    """Run the launcher (ConfigMap grpo-launch) with a stand-in `python3` that records its argv."""
    launch = one(overlay, "ConfigMap", "grpo-launch")["data"]["verl-launch.sh"]
    for _, pod in pod_specs(overlay):
        mounts = {m["mountPath"]: m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        if not mounts:
            continue  # the submitter
        assert vols[mounts[posixpath.dirname(LAUNCH)]]["configMap"]["name"] == "grpo-launch"
    for job in objects(overlay, "Job"):
        assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["/bin/sh", LAUNCH]
    overrides = tmp_path / "verl-overrides.txt"
    overrides.write_text(expected_generated(overlay)["verl-overrides.txt"])
    script = launch.replace(f"{CONFIG_DIR}/verl-overrides.txt", str(overrides))
    assert script != launch, "the launcher does not read the mounted verl-overrides.txt"
    (tmp_path / "launch.sh").write_text(script)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "python3"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"json.dump(sys.argv[1:], open({str(tmp_path / 'argv.json')!r}, 'w'))\n")
    fake.chmod(0o755)
    want = [ln for ln in overrides.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    # Decoy files that an override such as trainer.logger=["console"] would match if the shell globbed it.
    for arg in want:
        pre, _, rest = arg.partition("[")
        inner, _, post = rest.partition("]")
        if inner and "/" not in pre + inner[0] + post:
            (tmp_path / (pre + inner[0] + post)).write_text("")
    proc = subprocess.run(["/bin/sh", str(tmp_path / "launch.sh")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30, env={"PATH": f"{bindir}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    assert argv[2:] == want
    overrides.write_text("")
    proc = subprocess.run(["/bin/sh", str(tmp_path / "launch.sh")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30, env={"PATH": f"{bindir}:/usr/bin:/bin"})
    assert proc.returncode == 2 and "missing or empty" in proc.stderr


class _Models(BaseHTTPRequestHandler):
    """A stand-in for the front: /v1/models with the served models, 401 without `Bearer <token>`."""

    served: list[str] = []
    token = ""

    def do_GET(self):  # noqa: N802 (http.server API)
        if self.headers.get_all("Authorization") != [f"Bearer {self.token}"]:
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"object": "list", "data": [{"id": m} for m in self.served]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("overlay", TRL_OVERLAYS)
def test_wait_for_server_waits_for_the_served_model(overlay, tmp_path):
    """Run the init container's script against a stand-in front (/v1/models, the run's token asked) at the URL from
    trainer.yaml, with the token in its environment as the Secret would put it."""
    job = one(overlay, "Job", "trainer")
    (init,) = [c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "wait-for-server"]
    assert init["args"][:2] == ["python3", "-c"] and "command" not in init
    env = {e["name"]: e["value"] for e in init["env"] if "value" in e}
    want, token = env["GRPO_SERVED_MODEL"], run_token.make()
    env.update(GRPO_RUN_TOKEN=token, PYTHONPATH=str(ROOT))
    handler = type("Models", (_Models,), {"served": [], "token": token})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = trainer_config(overlay)
        cfg["async_grpo"]["vllm_server_base_url"] = f"http://127.0.0.1:{server.server_address[1]}/"
        path = tmp_path / "trainer.yaml"
        path.write_text(yaml.safe_dump(cfg))
        script = init["args"][2].replace(f"{CONFIG_DIR}/trainer.yaml", str(path))
        assert script != init["args"][2], "the init container does not read the mounted trainer.yaml"

        def run(wait_s: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                                  env={**os.environ, **env, "GRPO_WAIT_S": wait_s})

        handler.served = ["some-other-model"]
        proc = run("0")
        assert proc.returncode != 0 and "gave up" in proc.stderr, proc.stdout + proc.stderr
        handler.served = ["some-other-model", want]
        proc = run("30")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"lists {want}" in proc.stdout
        assert token not in proc.stdout + proc.stderr
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
            env={**os.environ, **env, "GRPO_RUN_TOKEN": "", "GRPO_WAIT_S": "0"})
        assert proc.returncode != 0 and "401" in proc.stderr, proc.stdout + proc.stderr
    finally:
        server.shutdown()


def test_the_documented_secret_command_makes_a_token_the_kit_accepts():
    """The one command `k8s render`/`check` and the docs give makes a Secret of the run's token that the front and the
    trainer accept (runtime.run_token's form), in the run's namespace, under the name and key the pods read; kubectl
    builds it client-side here (no cluster), and the command line itself holds no value."""
    res = resolved("h200")
    (cmd,) = render_k8s.secret_commands(res)
    readme = (ROOT / "k8s" / "README.md").read_text()
    assert cmd.replace(f"-n {res.spec.run.name} ", "-n <run> ") in readme, "k8s/README.md gives another command"
    proc = subprocess.run(["sh", "-c", cmd + " --dry-run=client -o json"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    secret = json.loads(proc.stdout)
    assert secret["metadata"]["namespace"] == res.spec.run.name and secret["metadata"]["name"] == TOKEN_REF["name"]
    value = base64.b64decode(secret["data"][TOKEN_REF["key"]]).decode()
    assert run_token.well_formed(value) and len(value) == 43, "not a token of the kit's form (no newline)"
    assert value not in cmd


# --- yamllint ------------------------------------------------------------------------------------------------


def test_yamllint_k8s_and_ansible():
    assert (ROOT / ".yamllint").is_file(), "the repository's .yamllint is missing"
    targets = [str(ROOT / d) for d in ("k8s", "ansible")]
    proc = subprocess.run([sys.executable, "-m", "yamllint", "--strict", "-c", str(ROOT / ".yamllint"), *targets],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
