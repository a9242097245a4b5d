"""Checks of each host itself: reachable over SSH, clock, Docker and Compose, machine type and GPUs, the server's
port, the NVIDIA driver against the images' CUDA."""

from __future__ import annotations

import re
from typing import Any

from grpo_deploy.hosts import facts as host_facts
from grpo_deploy.hosts import local_facts
from grpo_deploy.hosts.connect import HostError
from grpo_deploy.image_build import tags as image_tags
from grpo_deploy.names import CUDA_LABEL
from grpo_deploy.preflight.images import images_needed
from grpo_deploy.preflight.registry import FAIL, OK, SKIP, WARN, Result, check
from grpo_deploy.preflight.session import Context
from grpo_deploy.spec.resolve import Resolved

CLOCK_TOLERANCE_S = 5.0  # hosts whose clocks disagree more than this make logs and checkpoint times misleading
# The oldest driver branch each CUDA major runs on (NVIDIA's CUDA compatibility: CUDA 12.x R525, CUDA 13.x R580).
MIN_DRIVER = {12: 525, 13: 580}
# GPUs with CUDA forward compatibility (datacenter parts): an older driver can run a newer CUDA through the
# image's compat libraries, which vLLM turns on with VLLM_ENABLE_CUDA_COMPATIBILITY=1.
DATACENTER_GPUS = ("A100", "A30", "A40", "A10", "A16", "A2", "H100", "H200", "H800", "H20", "GH200", "B200", "B300",
                   "GB200", "GB300", "L40", "L4", "L20", "V100", "T4")
COMPAT_ENV = "VLLM_ENABLE_CUDA_COMPATIBILITY"


def reached(ctx: Context) -> list[tuple[Any, dict[str, Any]]]:
    """(spec host, its gathered facts) of every host that answered; the `reachable` check reports the others."""
    return [(host, found) for host in ctx.res.spec.hosts if not isinstance(found := ctx.facts_of(host), HostError)]


@check("reachable", "Every host answers over SSH with a verified host key (this machine needs none)")
def check_reachable(ctx: Context) -> list[Result]:
    out = []
    for host in ctx.res.spec.hosts:
        found = ctx.facts_of(host)
        if isinstance(found, HostError):
            out.append(Result("reachable", host.name, FAIL, found.what, found.fix))
        else:
            out.append(Result("reachable", host.name, OK, f"{found['reached']}: {found['machine']}"))
    return out


@check("clock", f"Host clocks agree within {CLOCK_TOLERANCE_S:.0f} s (logs, checkpoints and metrics are compared "
                "across hosts)")
def check_clock(ctx: Context) -> list[Result]:
    out = []
    for host, found in reached(ctx):
        offset = found.get("clock")
        if offset is None:
            out.append(Result("clock", host.name, WARN, "could not read the clock (date +%s.%N)"))
        elif abs(offset) > CLOCK_TOLERANCE_S:
            out.append(Result("clock", host.name, FAIL, f"clock is {offset:+.1f} s off this machine's",
                              "enable NTP on every host (timedatectl set-ntp true)"))
        else:
            out.append(Result("clock", host.name, OK, f"{offset:+.2f} s from this machine"))
    return out


@check("docker", "The Docker engine and Compose v2 answer on every host that runs containers")
def check_docker(ctx: Context) -> list[Result]:
    out = []
    for host, found in reached(ctx):
        version, compose = found["docker"][0], found["compose"]
        out.append(engine_problem(host.name, found["docker"]) or compose_problem(host.name, version, compose)
                   or replicas_compose_problem(host, compose)
                   or Result("docker", host.name, OK, f"engine {version}, compose {compose}",
                             data={"server_version": version, "compose": compose}))
    return out


def engine_problem(host_name: str, docker: tuple[str | None, str]) -> Result | None:
    """The failing verdict when no Docker engine answers (hosts.facts.docker_version's answer), else None; the
    testinfra check `docker_engine_answers` gives the same verdict."""
    version, why = docker
    if version is not None:
        return None
    return Result("docker", host_name, FAIL, f"no Docker engine answers for the login user: {why}",
                  "start Docker there (systemctl start docker) and add the user to the docker group")


def compose_problem(host_name: str, engine: str | None, compose: str | None) -> Result | None:
    """The failing verdict when `docker compose` (Compose v2) does not answer, else None (testinfra:
    `compose_v2_answers`)."""
    if compose:
        return None
    return Result("docker", host_name, FAIL, f"engine {engine or '?'} but no `docker compose` (Compose v2)",
                  "install the docker-compose-plugin package there (or the compose binary in ~/.docker/cli-plugins; "
                  "`make setup` on this machine)")


REPLICAS_COMPOSE = (2, 24, 4)  # `!override` (a further replica's own ports) arrived in Compose 2.24.4


def replicas_compose_problem(host, compose: str) -> Result | None:
    """Several vLLM replicas on *host* render `extends` with `ports: !override`: an older Compose fails on the tag
    or merges the ports (a further replica would publish the first one's port too)."""
    if (getattr(host, "replicas", None) or 1) < 2:
        return None
    found = tuple(int(x) for x in re.findall(r"\d+", compose or "")[:3])
    if len(found) == 3 and found >= REPLICAS_COMPOSE:
        return None
    need = ".".join(map(str, REPLICAS_COMPOSE))
    return Result("docker", host.name, FAIL, f"compose {compose} is older than {need}, which {host.replicas} replicas "
                  "on this host need (`ports: !override` in the rendered replicas file)",
                  f"upgrade the docker-compose-plugin there to {need} or newer")


@check("arch", "Each host's machine type and accelerator match its profile")
def check_arch(ctx: Context) -> list[Result]:
    return [arch_verdict(host, ctx.res.profiles[host.name], found) for host, found in reached(ctx)]


def arch_verdict(host, profile, found: dict[str, Any]) -> Result:
    """The host's machine type and GPUs ({machine, gpus} facts) against its profile; the testinfra check
    `gpus_visible` gives the same verdict."""
    machine, allowed = found["machine"], profile.hardware.get("arch") or []
    if machine not in allowed:
        return Result("arch", host.name, FAIL, f"the host is {machine}; profile {profile.name} is for "
                                               f"{', '.join(allowed)}", "pick the profile of that hardware")
    if profile.accelerator != "cuda":
        return Result("arch", host.name, OK, f"{machine}, no accelerator needed")
    gpus = found.get("gpus")
    if not gpus:
        return Result("arch", host.name, FAIL, f"profile {profile.name} needs an NVIDIA GPU; nvidia-smi found none",
                      "install the NVIDIA driver and container toolkit (ansible/ roles)")
    want = profile.hardware.get("gpu_name_contains")
    if want and not any(want.lower() in g.name.lower() for g in gpus):
        return Result("arch", host.name, FAIL, f"GPUs are {', '.join(sorted({g.name for g in gpus}))}; profile "
                                               f"{profile.name} is tuned for {want}", "pick the profile of that GPU")
    return Result("arch", host.name, OK, f"{machine}, {len(gpus)} x {gpus[0].name} (sm {gpus[0].compute_capability})")


@check("port", "The vLLM servers' published ports are free on each server host")
def check_port(ctx: Context) -> list[Result]:
    res = ctx.res
    servers = res.hosts_with("server")
    if not servers:
        return [Result("port", "-", SKIP, f"{res.engine} has no server role")]
    out = []
    for server in servers:
        found = ctx.facts_of(server)
        if isinstance(found, HostError):
            continue
        ports = found.get("listening") or {}
        taken = [p for p, on in ports.items() if on]
        unknown = [p for p, on in ports.items() if on is None]
        words = f"port {min(ports)}" if len(ports) == 1 else f"ports {min(ports)}-{max(ports)}" if ports else "ports"
        verb = "is" if len(ports) == 1 else "are"
        if found.get("running"):
            out.append(Result("port", server.name, FAIL, f"run {res.spec.run.name} already has running containers "
                              f"there ({', '.join(found['running'])})", "grpo-deploy down, or grpo-deploy status"))
        elif taken:
            out.append(Result("port", server.name, FAIL, f"something already listens on port "
                              f"{', '.join(map(str, taken))} there" + (f" (the replicas publish {words})"
                                                                        if len(ports) > 1 else ""),
                              "stop it, or set overrides: {vllm: {port: 8100}}"))
        elif unknown:
            out.append(Result("port", server.name, WARN, f"cannot tell whether {words} {verb} free there (`ss -ltn` "
                              "did not answer)", "install iproute2 there"))
        else:
            out.append(Result("port", server.name, OK, f"{words} {verb} free"))
    return out


@check("driver", "The NVIDIA driver on each GPU host runs the CUDA its images are built with (CUDA 13: R580+)")
def check_driver(ctx: Context) -> list[Result]:
    res, out = ctx.res, []
    client = ctx.docker()  # local images are what `up` ships to hosts that lack them
    for host in res.spec.hosts:
        if res.profiles[host.name].accelerator != "cuda":
            out.append(Result("driver", host.name, SKIP, f"profile {res.profiles[host.name].name} has no GPU"))
            continue
        found = ctx.facts_of(host)
        if isinstance(found, HostError):
            continue
        drivers = found["driver"]
        for role, tag in [(r, t) for h, r, t in images_needed(res) if h.name == host.name]:
            labels = ((found.get("images") or {}).get(role) or {}).get("labels")
            if labels is None and client is not None:
                labels = local_facts.image_labels(client, tag)
            out.append(driver_verdict(host.name, drivers, _image_cuda(tag, labels), tag, _compat_env(res)))
    return out


def _image_cuda(tag: str, labels: dict[str, str] | None) -> tuple[str | None, str]:
    """(CUDA major.minor of the image, where that came from): its label, else the kit's image table for its tag."""
    if labels and labels.get(CUDA_LABEL):
        return labels[CUDA_LABEL], "its label"
    for image in image_tags.GPU_IMAGES.values():
        if tag in {image_tags.arch_tag(image.name, a) for a in image.arches} | {image_tags.manifest_tag(image.name)}:
            return image.cuda, "the kit's image table (image not built here yet)"
    return None, f"no {CUDA_LABEL} label"


def _compat_env(res: Resolved) -> bool:
    env = getattr(getattr(res.settings, "vllm", None), "env", None) or {}
    return str(env.get(COMPAT_ENV, "")).strip() == "1"


def driver_verdict(host: str, drivers: list[host_facts.Driver] | None, cuda: tuple[str | None, str], tag: str,
                   compat_env: bool = False) -> Result:
    """The driver check's verdict for one image on one host, from nvidia-smi's answer and the image's CUDA."""
    version, source = cuda
    if not drivers:
        return Result("driver", host, FAIL, "nvidia-smi does not answer: no NVIDIA driver is loaded",
                      "install the NVIDIA driver (R580 or newer for CUDA 13 images) and the container toolkit")
    if version is None:
        return Result("driver", host, WARN, f"{tag}: CUDA unknown ({source}); driver {drivers[0].version}",
                      "rebuild the image with the kit's Dockerfiles (they set the label)")
    major = int(version.split(".")[0])
    need = MIN_DRIVER.get(major)
    have = min((d.major for d in drivers if d.major is not None), default=None)
    data = {"driver": drivers[0].version, "cuda": version, "min_driver": need}
    if need is None or have is None:
        return Result("driver", host, WARN, f"{tag}: CUDA {version}, driver {drivers[0].version}: no known minimum",
                      "check NVIDIA's CUDA compatibility table", data)
    fact = f"driver {drivers[0].version} (R{have}); {tag} is CUDA {version} (from {source}), which needs R{need}+"
    if have >= need:
        return Result("driver", host, OK, fact, data=data)
    datacenter = all(set(re.split(r"[^A-Z0-9]+", d.gpu.upper())) & set(DATACENTER_GPUS) for d in drivers)
    if datacenter and compat_env:
        return Result("driver", host, WARN, f"{fact}; {COMPAT_ENV}=1 is set: vLLM uses the image's CUDA forward "
                      "compatibility libraries", "upgrade the driver to R580+ when you can", data)
    if datacenter:
        return Result("driver", host, FAIL, f"{fact}: CUDA fails to initialise at start",
                      f"upgrade the NVIDIA driver to R{need} or newer, or (datacenter GPU: {drivers[0].gpu}) "
                      f"set {COMPAT_ENV}=1 where vLLM runs (trl-async: overrides: "
                      f"{{vllm: {{env: {{{COMPAT_ENV}: '1'}}}}}})",
                      data)
    return Result("driver", host, FAIL, f"{fact}: CUDA fails to initialise at start",
                  f"upgrade the NVIDIA driver to R{need} or newer ({drivers[0].gpu} has no CUDA forward compatibility)",
                  data)
