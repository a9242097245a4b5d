"""The base image without a registry: images/base.sh debootstraps a suite of recipes.BASE_SUITES (Debian bookworm by
default, Ubuntu noble; root), this module imports the tree with the Docker SDK. The mirror is the one this host's apt
uses for that suite, else debootstrap's default for it. The Release signature is always checked."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .build import image_or_none
from .progress import Step, StepFailed, human
from .recipes import BASE_SUITES, BaseSuite
from .wheelhouse import run_logged

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
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


def script_args(suite: BaseSuite, images: Path, rootfs: Path, mirror: str | None,
                security: str | None) -> list[str]:
    """images/base.sh's arguments for *suite* into *rootfs* (a None mirror: debootstrap's default)."""
    args = ["--suite", suite.name, "--components", ",".join(suite.components)]
    if suite.keyring:
        args += ["--keyring", str(images / suite.keyring)]
    if suite.script:
        args += ["--script", suite.script]
    if suite.pockets:
        args += ["--pockets", " ".join(suite.pockets)]
    return [*args, str(rootfs), *([mirror] if mirror else []), *([security] if mirror and security else [])]


def build_base(client, tag: str, script: Path, work_dir: Path, log_dir: Path, mirror: str | None = None,
               force: bool = False, suite: BaseSuite = BASE_SUITES["bookworm"]) -> bool:
    """debootstrap *suite* (images/base.sh) then `docker import`; False when *tag* exists and not force."""
    if not force and image_or_none(client, tag) is not None:
        return False
    missing = [tool for tool in ("debootstrap", "gpgv") if shutil.which(tool) is None]
    if missing:
        raise StepFailed(f"{' and '.join(missing)} not installed (apt-get install debootstrap gpgv)")
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
            step.update(f"debootstrap --variant=minbase {suite.name} (about a minute)")
            code = run_logged(["bash", str(script), *script_args(suite, script.parent, rootfs, mirror, security)],
                              step, lambda line: step.update(f"debootstrap: {line.strip()[:70]}"))
            if code != 0:
                raise StepFailed(f"debootstrap failed (exit {code})")
            step.update("docker import")
            labels = {"org.grpo-deploy.base": f"debootstrap minbase {suite.name}",
                      "org.grpo-deploy.base-mirror": mirror or "debootstrap default",
                      "org.grpo-deploy.base-created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            label_change = "LABEL " + " ".join(f'{k}="{v}"' for k, v in labels.items())
            repo, _, version = tag.rpartition(":")
            with subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
                                  stdout=subprocess.PIPE, stderr=step.log) as tar:
                chunks = iter(lambda: tar.stdout.read(1 << 20), b"")
                client.api.import_image_from_data(chunks, repository=repo, tag=version,
                                                  changes=[*ENV_CHANGES, label_change])
            if tar.returncode != 0:
                raise StepFailed(f"tar of the root filesystem failed (exit {tar.returncode})")
            step.done(f"built {tag} ({human(client.images.get(tag).attrs['Size'])})")
    finally:
        # base.sh unmounted what debootstrap mounted; stay on this filesystem all the same.
        subprocess.run(["rm", "-rf", "--one-file-system", str(rootfs)], check=False)
    return True
