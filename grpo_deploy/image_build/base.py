"""The base image without a registry: images/base.sh debootstraps a suite of recipes.BASE_SUITES (Debian bookworm by
default, Ubuntu noble; root) for this host's architecture or another one (arm64 on an x86_64 host runs under QEMU
user emulation), this module imports the tree with the Docker SDK. The mirror is the one this host's apt uses for that
suite, else debootstrap's default for it. The Release signature is always checked."""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from grpo_deploy.hosts import docker_api
from grpo_deploy.hosts.docker_api import image_or_none
from grpo_deploy.image_build.progress import Step, StepFailed, human
from grpo_deploy.image_build.recipes import BASE_SUITES, BaseSuite
from grpo_deploy.image_build.tags import MACHINES
from grpo_deploy.image_build.wheelhouse import run_logged

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
BINFMT = Path("/proc/sys/fs/binfmt_misc")
QEMU_HINT = ("apt-get install qemu-user-static binfmt-support (registers qemu-aarch64 with the F flag, so it works "
             "inside containers too)")
ENV_CHANGES = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "ENV LANG=C.UTF-8",
               'CMD ["bash"]']


def parse_sources(name: str, text: str) -> list[tuple[str, str]]:
    """(URI, suite) of every enabled `deb` source in one apt sources file (one-line or deb822 format), in order."""
    out: list[tuple[str, str]] = []
    if name.endswith(".sources"):  # deb822 stanzas separated by blank lines
        for stanza in text.split("\n\n"):
            fields: dict[str, list[str]] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.split()
            if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"])[0].lower() != "no":
                out += [(uri, suite) for uri in fields.get("uris", []) for suite in fields.get("suites", [])]
        return out
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):  # [arch=amd64 signed-by=...] options
            while words and not words[0].endswith("]"):
                words.pop(0)
            words = words[1:]
        if len(words) >= 2:
            out.append((words[0], words[1]))
    return out


def host_mirrors(paths: tuple[Path, ...] = APT_SOURCES, suite: str = "bookworm") -> tuple[str | None, str | None]:
    """(SUITE mirror, SUITE-security mirror) from this host's apt sources; None where it has none."""
    sources: list[tuple[str, str]] = []
    for path in paths:
        files = sorted(p for p in path.iterdir() if p.suffix in (".list", ".sources")) if path.is_dir() else [path]
        for f in files:
            if f.is_file():
                sources += parse_sources(f.name, f.read_text(errors="replace"))
    main = next((uri for uri, name in sources if name == suite), None)
    security = next((uri for uri, name in sources if name == f"{suite}-security"), None)
    return main, security


def is_foreign(arch: str | None, machine: str | None = None) -> bool:
    """Whether *arch* (Docker's name; None: this host's) is not the architecture of *machine* (default: this host)."""
    return arch is not None and MACHINES[arch] != (machine or platform.machine())


def foreign_arch_problem(arch: str | None, machine: str | None = None, binfmt: Path = BINFMT) -> str | None:
    """Why this host cannot run *arch*'s binaries (debootstrap's second stage, RUN steps, in-image checks), or None:
    its own architecture, or a qemu-user binfmt handler registered and enabled for it."""
    machine = machine or platform.machine()
    if not is_foreign(arch, machine):
        return None
    handler = binfmt / f"qemu-{MACHINES[arch]}"
    try:
        first = handler.read_text().splitlines()[:1]
    except OSError:
        return f"this {machine} host has no QEMU user emulation registered for {arch} ({handler} is missing): "  \
               + QEMU_HINT
    if first != ["enabled"]:
        return f"the QEMU handler {handler} for {arch} is registered but disabled: echo 1 > {handler}"
    return None


def script_args(suite: BaseSuite, images: Path, rootfs: Path, mirror: str | None,
                security: str | None, arch: str | None = None) -> list[str]:
    """images/base.sh's arguments for *suite* into *rootfs* (a None mirror: debootstrap's default)."""
    args = ["--suite", suite.name, "--components", ",".join(suite.components), *(["--arch", arch] if arch else [])]
    if suite.keyring:
        args += ["--keyring", str(images / suite.keyring)]
    if suite.script:
        args += ["--script", suite.script]
    if suite.pockets:
        args += ["--pockets", " ".join(suite.pockets)]
    return [*args, str(rootfs), *([mirror] if mirror else []), *([security] if mirror and security else [])]


def build_base(client, tag: str, script: Path, work_dir: Path, log_dir: Path, mirror: str | None = None,
               force: bool = False, suite: BaseSuite = BASE_SUITES["bookworm"], arch: str | None = None) -> bool:
    """debootstrap *suite* (images/base.sh) for *arch* (None: this host's) then `docker import`; False when *tag*
    exists and not force."""
    if not force and image_or_none(client, tag) is not None:
        return False
    missing = [tool for tool in ("debootstrap", "gpgv") if shutil.which(tool) is None]
    if missing:
        raise StepFailed(f"{' and '.join(missing)} not installed (apt-get install debootstrap gpgv)")
    problem = foreign_arch_problem(arch)
    if problem:
        raise StepFailed(problem)
    keyring = script.parent / suite.keyring if suite.keyring else None
    if keyring is not None and not keyring.is_file():
        raise StepFailed(f"{keyring} is missing: the kit ships the {suite.name} archive key there")
    security = None
    if mirror is None:
        mirror, security = host_mirrors(suite=suite.name)
    work_dir.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="rootfs.", dir=work_dir))
    try:
        with Step(f"base image {tag}", log_dir / "image-base.log") as step:
            step.update(f"debootstrap --variant=minbase {suite.name}{f' --arch {arch}' if arch else ''} "
                        f"({'minutes under emulation' if is_foreign(arch) else 'about a minute'})")
            code = run_logged(["bash", str(script), *script_args(suite, script.parent, rootfs, mirror, security,
                                                                 arch)],
                              step, lambda line: step.update(f"debootstrap: {line.strip()[:70]}"))
            if code != 0:
                raise StepFailed(f"debootstrap failed (exit {code})")
            step.update("docker import")
            labels = {"org.grpo-deploy.base": f"debootstrap minbase {suite.name}",
                      "org.grpo-deploy.base-arch": arch or "native",
                      "org.grpo-deploy.base-mirror": mirror or "debootstrap default",
                      "org.grpo-deploy.base-created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            label_change = "LABEL " + " ".join(f'{k}="{v}"' for k, v in labels.items())
            repo, _, version = tag.rpartition(":")
            with subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
                                  stdout=subprocess.PIPE, stderr=step.log) as tar:
                chunks = iter(lambda: tar.stdout.read(1 << 20), b"")
                import_rootfs(docker_api.for_work(client), chunks, repo, version, [*ENV_CHANGES, label_change], arch)
            if tar.returncode != 0:
                raise StepFailed(f"tar of the root filesystem failed (exit {tar.returncode})")
            step.done(f"built {tag} ({human(client.images.get(tag).attrs['Size'])})")
    finally:
        # base.sh unmounted what debootstrap mounted; stay on this filesystem all the same.
        subprocess.run(["rm", "-rf", "--one-file-system", str(rootfs)], check=False)
    return True


def import_rootfs(client, chunks, repo: str, tag: str, changes: list[str], arch: str | None) -> None:
    """`docker import` of a tar stream. For another architecture than the engine's, the image's config is then made
    to say it (Docker 20.10 ignores the import's platform): images built FROM it inherit it, and an engine on that
    architecture runs them without a platform warning."""
    client.api.import_image_from_data(chunks, repository=repo, tag=tag, changes=changes)
    if arch is not None:
        set_architecture(client, f"{repo}:{tag}", arch)


def set_architecture(client, ref: str, arch: str) -> None:
    """Rewrite the architecture in a (small) image's config: docker save, edit config JSON, docker load."""
    import hashlib
    import io
    import json
    import tarfile

    image = client.images.get(ref)
    if image.attrs.get("Architecture") == arch:
        return
    saved = io.BytesIO(b"".join(image.save(named=True)))
    out = io.BytesIO()
    with tarfile.open(fileobj=saved) as src, tarfile.open(fileobj=out, mode="w") as dst:
        manifest = json.loads(src.extractfile("manifest.json").read())
        old_name = manifest[0]["Config"]
        config = json.loads(src.extractfile(old_name).read())
        config["architecture"] = arch
        config.pop("variant", None)
        if arch == "arm64":
            config["variant"] = "v8"
        config_bytes = json.dumps(config, separators=(",", ":")).encode()
        new_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
        manifest[0]["Config"] = new_name
        replaced = {old_name: (new_name, config_bytes),
                    "manifest.json": ("manifest.json", json.dumps(manifest).encode())}
        for member in src.getmembers():
            if member.name in replaced:
                name, data = replaced[member.name]
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                dst.addfile(info, io.BytesIO(data))
            else:
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    old_id = image.id
    client.images.load(out.getvalue())
    if client.images.get(ref).id != old_id:
        client.images.remove(old_id, noprune=False)
