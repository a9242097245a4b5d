"""Static checks of the kustomize tree in k8s/ (no cluster: nothing here is applied anywhere).

For every overlay k8s/<name>/ with a kustomization.yaml:
  (a) generated/ is exactly what the renderer makes of the overlay's spec.yaml now;
  (b) `kubectl kustomize` builds it;
  (c) every built object validates against the pinned Kubernetes OpenAPI schemas (kubernetes-validate, strict);
  (d) policy over the built objects: non-root as the spec's UID/GID, probes, limits, pinned images equal to the
      spec's, one server replica, secrets only by reference, the shared volume at the spec's mount everywhere,
      NFS and GPU/arch placement as the spec and its profile say, no placeholder left;
and two behaviour checks of the shell/Python snippets in the manifests (the verl launcher and the trainer's
wait-for-server init container), run here against stand-ins for python3 and for the vLLM server.
Also: yamllint over k8s/ and ansible/ with the repository's .yamllint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from grpo_deploy import committed, render, render_folder, resolve, spec

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUBERNETES_VERSION = "1.37"
EXPECTED_OVERLAYS = {"a100", "h200", "gb10", "cpu"}
CONFIG_DIR = "/etc/grpo-deploy"
SECRET_NAME = "grpo-deploy-secrets"
SECRET_LIKE = ("TOKEN", "API_KEY", "PASSWORD", "SECRET")
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
HEALTH_CMD = ["python3", "-m", "grpo_deploy.runtime.health", "--role", "server"]
K8S_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
# Role of each main container -> the key of its image in the resolved spec.
IMAGE_OF = {"server": "server", "trainer": "trainer", "wait-for-server": "trainer", "verl": "verl"}
MIN_SERVER_STARTUP_S = 900  # a first model load on a Spark takes 10-15 min


def discover() -> list[str]:
    return sorted(p.parent.name for p in K8S.glob("*/kustomization.yaml"))


OVERLAYS = discover()


def _engine(overlay: str) -> str:
    return yaml.safe_load((K8S / overlay / "spec.yaml").read_text())["engine"]


TRL_OVERLAYS = [o for o in OVERLAYS if (K8S / o / "spec.yaml").is_file() and _engine(o) == "trl-async"]
VERL_OVERLAYS = [o for o in OVERLAYS if (K8S / o / "spec.yaml").is_file() and _engine(o) == "verl"]


# --- helpers -----------------------------------------------------------------------------------------------


@cache
def resolved(overlay: str) -> resolve.Resolved:
    return resolve.resolve(spec.load(K8S / overlay / "spec.yaml"))


@cache
def expected_generated(overlay: str) -> dict[str, str]:
    """What `grpo-deploy render -f k8s/<overlay>/spec.yaml` puts in config/ plus k8s/params.env, by file name."""
    return committed.k8s_generated(K8S / overlay)


@cache
def build(overlay: str) -> tuple[dict, ...]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl not found on PATH (its built-in kustomize builds the overlays)"
    proc = subprocess.run([kubectl, "kustomize", str(K8S / overlay)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize k8s/{overlay} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc is not None)


def objects(overlay: str, kind: str) -> list[dict]:
    return [o for o in build(overlay) if o["kind"] == kind]


def one(overlay: str, kind: str, name: str) -> dict:
    found = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"k8s/{overlay}: expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_specs(overlay: str) -> list[tuple[str, dict]]:
    out = [(f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
           for o in build(overlay) if o["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet")]
    assert out, f"k8s/{overlay}: no workloads built"
    return out


def containers(pod: dict, init: bool = True) -> list[dict]:
    return list(pod.get("containers", [])) + (list(pod.get("initContainers", [])) if init else [])


def all_containers(overlay: str, init: bool = True) -> list[tuple[str, dict, dict]]:
    return [(f"{where}/{c['name']}", pod, c) for where, pod in pod_specs(overlay) for c in containers(pod, init)]


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


def server_args(overlay: str) -> list[str]:
    return render.server_args(resolved(overlay))


def trainer_config(overlay: str) -> dict:
    return yaml.safe_load(expected_generated(overlay)["trainer.yaml"])


def verl_overrides(overlay: str) -> dict[str, str]:
    # KEY=VALUE lines, like an env file
    return render_folder.parse_env(expected_generated(overlay)["verl-overrides.txt"])


# --- discovery ---------------------------------------------------------------------------------------------


def test_expected_overlays_exist():
    assert EXPECTED_OVERLAYS <= set(OVERLAYS), f"missing overlays: {sorted(EXPECTED_OVERLAYS - set(OVERLAYS))}"
    assert {"h200", "gb10", "cpu"} <= set(TRL_OVERLAYS), f"trl-async overlays found: {TRL_OVERLAYS}"
    assert "a100" in VERL_OVERLAYS, f"verl overlays found: {VERL_OVERLAYS}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_has_spec_and_generated(overlay):
    assert (K8S / overlay / "spec.yaml").is_file(), f"k8s/{overlay}/spec.yaml missing"
    assert (K8S / overlay / "generated").is_dir(), f"k8s/{overlay}/generated/ missing"


# --- (a) generated/ equals a fresh render --------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_generated_equals_fresh_render(overlay):
    expected = expected_generated(overlay)
    folder = K8S / overlay / "generated"
    actual = {p.name: p.read_text() for p in folder.iterdir() if p.is_file()}
    fix = (f"regenerate: grpo-deploy render -f k8s/{overlay}/spec.yaml -o /tmp/r && rm -f k8s/{overlay}/generated/* && "
           f"cp /tmp/r/config/* /tmp/r/k8s/params.env k8s/{overlay}/generated/")
    assert sorted(actual) == sorted(expected), f"k8s/{overlay}/generated/ has other files than the render; {fix}"
    stale = [name for name in expected if actual[name] != expected[name]]
    assert not stale, f"k8s/{overlay}/generated/{stale} differ from a fresh render of spec.yaml; {fix}"


# --- (b) kustomize builds ------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_builds(overlay):
    built = build(overlay)
    assert built, f"k8s/{overlay} built no objects"
    for obj in built:
        assert obj.get("apiVersion") and obj.get("kind") and obj.get("metadata", {}).get("name"), obj


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_placeholder_left_and_params_not_applied(overlay):
    text = yaml.safe_dump_all(build(overlay))
    assert "placeholder" not in text, f"k8s/{overlay}: a placeholder was not replaced from params.env"
    assert "nfs.invalid" not in text
    names = {(o["kind"], o["metadata"]["name"]) for o in build(overlay)}
    assert ("ConfigMap", "grpo-params") not in names, "grpo-params is build-time only (local-config)"


# --- (c) OpenAPI schema validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_validate_against_kubernetes_schema(overlay):
    errors = []
    for obj in build(overlay):
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {'.'.join(map(str, exc.path))}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: no {KUBERNETES_VERSION} schema ({exc})")
    assert not errors, "\n".join(errors)


# --- (d) policy ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_non_root_as_the_spec_uid(overlay):
    run = resolved(overlay).spec.run
    problems = []
    for where, pod in pod_specs(overlay):
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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_requests_and_limits(overlay):
    problems = []
    for where, pod, c in all_containers(overlay):
        res = c.get("resources", {})
        for kind in ("cpu", "memory"):
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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned_and_equal_the_spec(overlay):
    images = resolved(overlay).images
    problems = []
    for where, _, c in all_containers(overlay):
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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workloads_of_the_engine(overlay):
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in build(overlay) if o["kind"] in
                   ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "HorizontalPodAutoscaler"))
    want = ["Deployment/server", "Job/trainer"] if overlay in TRL_OVERLAYS else ["Job/verl"]
    assert kinds == want, f"k8s/{overlay}: workloads {kinds}, expected {want}"


@pytest.mark.parametrize("overlay", TRL_OVERLAYS)
def test_exactly_one_server_replica(overlay):
    dep = one(overlay, "Deployment", "server")
    assert dep["spec"].get("replicas") == 1, "TRL talks to one base URL: exactly one vLLM replica"
    assert dep["spec"].get("strategy", {}).get("type") == "Recreate", "a rolling update would run two servers"
    assert not objects(overlay, "HorizontalPodAutoscaler")


@pytest.mark.parametrize("overlay", TRL_OVERLAYS)
def test_server_probes(overlay):
    pod = one(overlay, "Deployment", "server")["spec"]["template"]["spec"]
    (server,) = [c for c in pod["containers"] if c["name"] == "server"]
    ports = {p.get("name"): p["containerPort"] for p in server.get("ports", [])}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in server, f"server has no {probe}"
        http = server[probe].get("httpGet")
        if http:
            assert http["port"] in ports or http["port"] in ports.values(), f"{probe} port {http['port']} not exposed"
    assert server["readinessProbe"].get("exec", {}).get("command") == HEALTH_CMD, \
        "readiness must be `/v1/models lists the served model` (grpo_deploy.runtime.health), not /health"
    # The health command reads the served model and port from the environment (server.env via envFrom).
    env: dict[str, str] = {}
    for src in server.get("envFrom", []):
        (cm,) = [o for o in objects(overlay, "ConfigMap") if o["metadata"]["name"] == src["configMapRef"]["name"]]
        env.update(cm["data"])
    assert env.get("GRPO_SERVED_MODEL") == resolved(overlay).settings.model.served_name
    assert env.get("GRPO_SERVER_PORT") == str(ports["http"]), "the readiness check would ask another port"
    startup = server["startupProbe"]
    budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    assert budget >= MIN_SERVER_STARTUP_S, (f"startupProbe allows {budget} s, less than a model load "
                                            f"({MIN_SERVER_STARTUP_S} s)")


@pytest.mark.parametrize("overlay", TRL_OVERLAYS)
def test_trainer_reaches_the_server_service(overlay):
    url = urlsplit(trainer_config(overlay)["async_grpo"]["vllm_server_base_url"])
    svc = one(overlay, "Service", url.hostname)
    (svc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    dep = one(overlay, "Deployment", "server")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items(), "the Service does not select the server pods"
    (server,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "server"]
    (port,) = [p for p in server["ports"]
               if p["name"] == svc_port["targetPort"] or p["containerPort"] == svc_port["targetPort"]]
    args = server_args(overlay)
    assert port["containerPort"] == int(args[args.index("--port") + 1]), "containerPort != vLLM --port"
    (init,) = [c for c in one(overlay, "Job", "trainer")["spec"]["template"]["spec"]["initContainers"]
               if c["name"] == "wait-for-server"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["GRPO_SERVED_MODEL"] == resolved(overlay).settings.model.served_name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_only_by_reference(overlay):
    assert not objects(overlay, "Secret"), "no Secret objects in the build: secrets are created by the user"
    problems = []
    for where, _, c in all_containers(overlay):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                if ref.get("name") != SECRET_NAME or ref.get("optional") is not True:
                    problems.append(f"{where}: env {e['name']} refers to {ref}, expected {SECRET_NAME} optional")
            elif any(word in e["name"].upper() for word in SECRET_LIKE):
                problems.append(f"{where}: env {e['name']} looks like a secret but is not a secretKeyRef")
        for src in c.get("envFrom", []):
            if "secretRef" in src and (src["secretRef"].get("name") != SECRET_NAME
                                       or not src["secretRef"].get("optional")):
                problems.append(f"{where}: envFrom {src}")
    # Nothing secret-looking in the ConfigMaps either: neither as a key nor as a NAME=value line of a file.
    for cm in objects(overlay, "ConfigMap"):
        for key, value in (cm.get("data") or {}).items():
            names = [key] + [ln.split("=", 1)[0] for ln in str(value).splitlines() if "=" in ln]
            for name in names:
                if ENV_NAME.fullmatch(name) and any(word in name for word in SECRET_LIKE):
                    problems.append(f"ConfigMap {cm['metadata']['name']}: {key} carries {name}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shared_volume_at_the_spec_mount_in_every_container(overlay):
    mount = resolved(overlay).spec.storage.mount
    assert one(overlay, "PersistentVolumeClaim", "shared")
    problems = []
    for where, pod in pod_specs(overlay):
        vol = shared_claim_volume(pod)
        for c in containers(pod):
            paths = [m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] == vol]
            is_init = c in pod.get("initContainers", [])
            if paths != [mount] and not (is_init and not paths):
                problems.append(f"{where}/{c['name']}: shared volume at {paths}, expected [{mount!r}]")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_config_mounted_read_only_with_the_rendered_files(overlay):
    expected = expected_generated(overlay)
    problems = []
    for where, pod in pod_specs(overlay):
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        for c in containers(pod):
            mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == CONFIG_DIR]
            if len(mounts) != 1 or mounts[0].get("readOnly") is not True:
                problems.append(f"{where}/{c['name']}: {CONFIG_DIR} must be mounted once, read-only")
                continue
            cm_name = vols[mounts[0]["name"]]["configMap"]["name"]
            (cm,) = [o for o in objects(overlay, "ConfigMap") if o["metadata"]["name"] == cm_name]
            data = cm["data"]
            for name, text in expected.items():
                if name != "params.env" and data.get(name) != text:
                    problems.append(f"{where}/{c['name']}: {CONFIG_DIR}/{name} is not the rendered file")
            for arg in c.get("command", []) + c.get("args", []):
                for token in str(arg).replace('"', " ").replace("=", " ").split():
                    if token.startswith(CONFIG_DIR + "/") and token[len(CONFIG_DIR) + 1:] not in data:
                        problems.append(f"{where}/{c['name']}: uses {token}, absent from ConfigMap {cm_name}")
            for src in c.get("envFrom", []):
                ref = src.get("configMapRef")
                if ref:
                    (env_cm,) = [o for o in objects(overlay, "ConfigMap") if o["metadata"]["name"] == ref["name"]]
                    role_env = f"{c['name']}.env"
                    if env_cm["data"] != render_folder.parse_env(expected[role_env]):
                        problems.append(f"{where}/{c['name']}: env ConfigMap != rendered {role_env}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shared_storage_follows_the_spec(overlay):
    nfs = resolved(overlay).spec.storage.nfs
    pvc = one(overlay, "PersistentVolumeClaim", "shared")
    pvs = objects(overlay, "PersistentVolume")
    if nfs is None:
        assert not pvs, "no storage.nfs in the spec, yet a PersistentVolume was built"
        assert "volumeName" not in pvc["spec"]
        return
    assert len(pvs) == 1, f"storage.nfs is set: expected one NFS PersistentVolume, found {len(pvs)}"
    pv = pvs[0]
    assert pv["spec"]["nfs"] == {"server": nfs.server, "path": nfs.export}, \
        f"PV nfs {pv['spec']['nfs']} != spec storage.nfs server/export ({nfs.server}, {nfs.export})"
    assert pv["spec"].get("mountOptions") == nfs.options.split(","), "PV mountOptions != spec storage.nfs.options"
    assert pvc["spec"].get("volumeName") == pv["metadata"]["name"]
    assert pvc["spec"].get("storageClassName") == "" == pv["spec"].get("storageClassName")
    assert "ReadWriteMany" in pv["spec"]["accessModes"] and "ReadWriteMany" in pvc["spec"]["accessModes"]
    assert quantity(pv["spec"]["capacity"]["storage"]) >= quantity(pvc["spec"]["resources"]["requests"]["storage"])
    assert pv["spec"].get("persistentVolumeReclaimPolicy") == "Retain", "deleting a run must not delete checkpoints"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_and_arch_placement_follow_the_profile(overlay):
    res = resolved(overlay)
    (profile,) = {p.name: p for p in res.profiles.values()}.values()
    arches = {K8S_ARCH[a] for a in profile.hardware.get("arch", [])}
    problems = []
    for where, pod in pod_specs(overlay):
        selector = pod.get("nodeSelector", {})
        if len(arches) == 1 and selector.get("kubernetes.io/arch") != next(iter(arches)):
            problems.append(f"{where}: nodeSelector arch {selector.get('kubernetes.io/arch')!r}, profile says {arches}")
        for c in pod["containers"]:
            gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            if profile.accelerator == "cuda":
                want = int(verl_overrides(overlay)["trainer.n_gpus_per_node"]) if c["name"] == "verl" else 1
                if gpus is None or int(gpus) != want:
                    problems.append(f"{where}/{c['name']}: nvidia.com/gpu {gpus}, expected {want}")
                if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])):
                    problems.append(f"{where}: no toleration for the nvidia.com/gpu taint")
            elif gpus is not None:
                problems.append(f"{where}/{c['name']}: profile {profile.name} has no GPU, yet nvidia.com/gpu={gpus}")
        for c in pod.get("initContainers", []):
            if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {}):
                problems.append(f"{where}/{c['name']}: an init container must not hold a GPU")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_carry_the_run_and_use_the_tokenless_service_account(overlay):
    run = resolved(overlay).spec.run.name
    sa = one(overlay, "ServiceAccount", "grpo-deploy")
    assert sa.get("automountServiceAccountToken") is False
    problems = [f"{o['kind']}/{o['metadata']['name']}: grpo-deploy/run label != {run!r}"
                for o in build(overlay) if o["kind"] != "ConfigMap"
                and o["metadata"].get("labels", {}).get("grpo-deploy/run") != run]
    for where, pod in pod_specs(overlay):
        if pod.get("serviceAccountName") != "grpo-deploy" or pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: must use ServiceAccount grpo-deploy without a mounted token")
        if pod.get("enableServiceLinks") is not False:
            problems.append(f"{where}: enableServiceLinks must be false (Service env vars can clash with vLLM's)")
    for o in build(overlay):
        if o["kind"] in ("Deployment", "Job"):
            if o["spec"]["template"]["metadata"]["labels"].get("grpo-deploy/run") != run:
                problems.append(f"{o['kind']}/{o['metadata']['name']}: pod template run label != {run!r}")
    assert not problems, "\n".join(problems)


# --- behaviour of the snippets inside the manifests ----------------------------------------------------------


@pytest.mark.parametrize("overlay", VERL_OVERLAYS)
def test_verl_launcher_passes_every_override_verbatim(overlay, tmp_path):
    """Run the Job's shell script with a stand-in `python3` that records its argv."""
    (job,) = objects(overlay, "Job")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"][:2] == ["/bin/sh", "-c"]
    overrides = tmp_path / "verl-overrides.txt"
    overrides.write_text(expected_generated(overlay)["verl-overrides.txt"])
    script = c["args"][0].replace(f"{CONFIG_DIR}/verl-overrides.txt", str(overrides))
    assert script != c["args"][0], "the launcher does not read the mounted verl-overrides.txt"
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
    proc = subprocess.run(["/bin/sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bindir}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    assert argv[2:] == want
    overrides.write_text("")
    proc = subprocess.run(["/bin/sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bindir}:/usr/bin:/bin"})
    assert proc.returncode != 0 and "missing or empty" in proc.stderr


class _Models(BaseHTTPRequestHandler):
    served: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server API)
        body = json.dumps({"object": "list", "data": [{"id": m} for m in self.served]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("overlay", TRL_OVERLAYS)
def test_wait_for_server_waits_for_the_served_model(overlay, tmp_path):
    """Run the init container's script against a stand-in /v1/models at the URL from trainer.yaml."""
    job = one(overlay, "Job", "trainer")
    (init,) = [c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "wait-for-server"]
    env = {e["name"]: e["value"] for e in init["env"]}
    want = env["GRPO_SERVED_MODEL"]
    handler = type("Models", (_Models,), {"served": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = trainer_config(overlay)
        cfg["async_grpo"]["vllm_server_base_url"] = f"http://127.0.0.1:{server.server_address[1]}/"
        path = tmp_path / "trainer.yaml"
        path.write_text(yaml.safe_dump(cfg))
        script = init["args"][0].replace(f"{CONFIG_DIR}/trainer.yaml", str(path))
        assert script != init["args"][0], "the init container does not read the mounted trainer.yaml"

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
    finally:
        server.shutdown()


# --- yamllint ------------------------------------------------------------------------------------------------


def test_yamllint_k8s_and_ansible():
    assert (ROOT / ".yamllint").is_file(), "the repository's .yamllint is missing"
    targets = [str(ROOT / d) for d in ("k8s", "ansible")]
    proc = subprocess.run([sys.executable, "-m", "yamllint", "--strict", "-c", str(ROOT / ".yamllint"), *targets],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
