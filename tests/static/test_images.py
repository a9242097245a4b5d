"""Static checks of the image definitions against the defects GPU images had (issue 9), one test per class: what the
kit runs in an image calls `python3` (the upstream vLLM image has no `python`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.rglob("Dockerfile*"))
BARE_PYTHON = re.compile(r"(?<![\w./-])python(?![\w.-])")


def _commands_in(obj) -> list[list[str]]:
    """Every command a compose service or a Kubernetes container gives: command, args, healthcheck test, exec probes."""
    found: list[list[str]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("command", "args", "entrypoint", "test") and isinstance(value, (list, str)):
                found.append([value] if isinstance(value, str) else [str(v) for v in value])
            else:
                found.extend(_commands_in(value))
    elif isinstance(obj, list):
        for item in obj:
            found.extend(_commands_in(item))
    return found


def _bare_python(words: list[str]) -> list[str]:
    """Words (or shell lines inside them) that run a bare `python`."""
    bad = []
    for word in words:
        for line in word.splitlines():
            code = line.split("#", 1)[0]
            if code.strip() == "python" or re.search(r"(^|[;&|(]|exec|\bthen|\bdo)\s*python(\s|$)", code.strip()):
                bad.append(line.strip())
    return bad


YAML_WITH_COMMANDS = sorted([*(ROOT / "compose").glob("*.yaml"), *(ROOT / "k8s" / "base").rglob("*.yaml")])


@pytest.mark.parametrize("path", YAML_WITH_COMMANDS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_bare_python_in_compose_and_k8s_commands(path: Path):
    bad = []
    for doc in yaml.safe_load_all(path.read_text()):
        for command in _commands_in(doc):
            bad += _bare_python(command)
    assert not bad, f"{path.relative_to(ROOT)} runs `python` in an image (the vLLM image has only python3): {bad}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(IMAGES).as_posix())
def test_no_bare_python_in_dockerfile_instructions(dockerfile: Path):
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    bad = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#") and BARE_PYTHON.search(ln)
           and not ln.lstrip().startswith(("LABEL", "ENV"))]
    assert not bad, f"{dockerfile.relative_to(ROOT)} calls `python`: {bad}"


PY_SOURCES = sorted([*(ROOT / "grpo_deploy").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])
PY_ARGV = re.compile(r"""["']python["']\s*,|["']python\s+-[mc]\s""")


def test_no_bare_python_in_argv_the_kit_builds():
    """docker run / exec argv lists and command strings in the kit's Python code (preflight's probe, deploy, bench)."""
    bad = [f"{p.relative_to(ROOT)}:{n}: {ln.strip()}" for p in PY_SOURCES
           for n, ln in enumerate(p.read_text().splitlines(), 1) if PY_ARGV.search(ln)]
    assert not bad, "argv with a bare `python` (the vLLM image has only python3):\n" + "\n".join(bad)


# --- caches under HOME belong to the run user -----------------------------------------------------------------

CREATE_USER = IMAGES / "common" / "create-user.sh"
RUN_HOME = "/home/grpo"


def owned_dirs() -> set[str]:
    """The directories create-user.sh makes with the run user as owner ($home spelled out)."""
    text = CREATE_USER.read_text()
    dirs: set[str] = set()
    for listed in re.findall(r'for dir in ([^;\n]+); do\s*\n\s*install -d -o "\$uid" -g "\$gid"', text):
        dirs |= {d.strip('"').replace("$home", RUN_HOME) for d in listed.split()}
    if re.search(r'chown "\$uid:\$gid" "\$home"', text):
        dirs.add(RUN_HOME)
    return dirs


def test_create_user_makes_the_caches_owned_by_the_run_user():
    assert {RUN_HOME, f"{RUN_HOME}/.cache", f"{RUN_HOME}/.cache/huggingface", f"{RUN_HOME}/.cache/vllm"} <= owned_dirs()


def test_every_volume_under_home_is_a_directory_the_image_owns():
    """A named volume starts as a copy of the image's directory (owner included); a missing one is created root-owned."""
    cfg = yaml.safe_load((ROOT / "compose" / "compose.yaml").read_text())
    targets = {v.split(":")[1] for svc in [cfg["x-run"], *cfg["services"].values()] for v in svc.get("volumes", [])
               if isinstance(v, str) and v.count(":") >= 1}
    under_home = {t for t in targets if t.startswith(RUN_HOME)}
    assert under_home, "compose mounts no cache under the run user's HOME any more: review this test"
    assert under_home <= owned_dirs(), f"not created owned by the run user in the image: {under_home - owned_dirs()}"


@pytest.mark.parametrize("dockerfile", [d for d in DOCKERFILES if not d.name.endswith(".deps")],
                         ids=lambda p: p.relative_to(IMAGES).as_posix())
def test_every_image_makes_its_run_user_with_create_user(dockerfile: Path):
    text = dockerfile.read_text()
    runs_it = re.search(r'^RUN /opt/grpo-deploy/bin/create-user\.sh "\$\{UID\}" "\$\{GID\}" ' + RUN_HOME + r"$",
                        text, re.M)
    inherits = re.search(r"^ARG BASE_IMAGE=grpo-deploy/(vllm|cpu)", text, re.M) and "create-user.sh" not in text
    assert runs_it or inherits, "the run user (and its caches) must come from images/common/create-user.sh"
    assert re.search(r"^ENV HOME=" + RUN_HOME, text, re.M) or inherits
