"""Static checks of the image definitions against the defects the GPU images had (issue 9), one test per class:
what the kit runs in an image calls `python3` (the upstream vLLM image has no `python`); caches under HOME belong to
the run user; no platform ARG has a default; tags come from grpo_deploy/image_build/tags.py and the bake file and the
profiles follow it; bake builds the native platform unless asked; the arch lists cover every profile's GPU (GB10:
12.1a) and the images label the CUDA they check; bases are pinned by digest or listed as not verifiable; every
HEALTHCHECK checks a role the health module knows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from grpo_deploy import __version__
from grpo_deploy.image_build import tags as image_tags
from grpo_deploy.runtime import health
from grpo_deploy.spec import profiles

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.rglob("Dockerfile*"))
K8S_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
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


class _ComposeLoader(yaml.SafeLoader):
    """YAML with compose's merge tags (`!reset`, `!override`: compose.front.yaml resets the server's ports), each
    read as the plain value it tags."""


for _tag in ("!reset", "!override"):
    _ComposeLoader.add_constructor(_tag, lambda loader, node: (
        loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node) if isinstance(node, yaml.MappingNode) else loader.construct_scalar(node)))


YAML_WITH_COMMANDS = sorted([*(ROOT / "compose").glob("*.yaml"), *(ROOT / "k8s" / "base").rglob("*.yaml")])


@pytest.mark.parametrize("path", YAML_WITH_COMMANDS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_bare_python_in_compose_and_k8s_commands(path: Path):
    bad = []
    for doc in yaml.load_all(path.read_text(), Loader=_ComposeLoader):  # noqa: S506 - a SafeLoader with two tags
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
    """A new named volume is a copy of the image's directory (owner included); a missing one is made root-owned."""
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


# --- platform ARGs: no defaults (under BuildKit a default beats the platform's value) ---------------------------

PLATFORM_ARGS = ("TARGETPLATFORM", "TARGETOS", "TARGETARCH", "TARGETVARIANT",
                 "BUILDPLATFORM", "BUILDOS", "BUILDARCH", "BUILDVARIANT")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(IMAGES).as_posix())
def test_no_platform_arg_has_a_default(dockerfile: Path):
    bad = re.findall(r"^\s*ARG\s+(" + "|".join(PLATFORM_ARGS) + r")\s*=.*$", dockerfile.read_text(), re.M)
    assert not bad, f"{dockerfile.relative_to(ROOT)} gives a platform ARG a default: {bad}"


# --- tags: one formula (grpo_deploy/image_build/tags.py), the bake file and the profiles follow it --------------------

BAKE = IMAGES / "docker-bake.hcl"


def bake_text() -> str:
    return "\n".join(ln.split("#", 1)[0] for ln in BAKE.read_text().splitlines())


def bake_variables() -> dict[str, str]:
    return dict(re.findall(r'variable "(\w+)" \{\s*default\s*=\s*"([^"]*)"\s*\}', bake_text()))


def bake_function(name: str) -> tuple[list[str], str]:
    m = re.search(r'function "' + name + r'" \{\s*params\s*=\s*\[([^\]]*)\]\s*result\s*=\s*(.+?)\n\s*\}', bake_text())
    assert m, f"docker-bake.hcl has no function {name}"
    return [p.strip() for p in m.group(1).split(",") if p.strip()], m.group(2).strip()


def bake_targets() -> dict[str, str]:
    """target name -> its block (the targets that build an image; `_common` excluded)."""
    blocks = re.findall(r'target "(\w+)" \{(.*?)\n\}', bake_text(), re.S)
    return {name: body for name, body in blocks if not name.startswith("_")}


def expand(template: str, values: dict[str, str]) -> str:
    """A bake string template with ${NAME} interpolations (all this file's tag functions use)."""
    assert template.startswith('"') and template.endswith('"'), template
    return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], template[1:-1])


def bake_tags() -> set[str]:
    """Every tag the bake file produces for both architectures with its default variables."""
    variables = bake_variables()
    params, result = bake_function("tag")
    m_params, m_result = bake_function("manifest_tag")
    tags = set()
    for name, body in bake_targets().items():
        m = re.search(r'tags\s*=\s*\[tag\("(\w+)",\s*arch\)\]', body)
        assert m, f"bake target {name} must tag with tag(\"{name}\", arch)"
        for arch in image_tags.ARCHES:
            tags.add(expand(result, {**variables, params[0]: m.group(1), params[1]: arch}))
        tags.add(expand(m_result, {**variables, m_params[0]: m.group(1)}))
    return tags


def test_bake_targets_are_the_gpu_images_of_the_table():
    assert set(bake_targets()) == set(image_tags.GPU_IMAGES)
    for name, body in bake_targets().items():
        assert f'dockerfile = "{image_tags.GPU_IMAGES[name].dockerfile}"' in re.sub(r"\s+", " ", body)
        assert f'name = "{name}-${{arch}}"' in re.sub(r"\s+", " ", body), "one target (and tag) per architecture"


def test_bake_tags_are_the_tags_of_the_table():
    assert bake_variables()["TAG"] == __version__
    assert {image_tags.cuda_suffix(i.cuda) for i in image_tags.GPU_IMAGES.values()} == {bake_variables()["CUDA"]}
    assert bake_tags() == image_tags.produced() - {image_tags.CPU_TAG, image_tags.VERL_CPU_TAG}


def test_every_profile_names_a_tag_the_build_produces():
    produced = image_tags.produced()
    for profile in map(profiles.load, profiles.names()):  # as composed: a base's keys merged in
        for key, tag in profile.images.items():
            assert tag in produced, f"profile {profile.name} images.{key}: {tag} is not built by the kit " \
                                    f"(built: {sorted(produced)})"
            if profile.accelerator == "cuda":
                arches = {K8S_ARCH[a] for a in profile.hardware["arch"]}
                assert any(tag.endswith(f"-{a}") for a in arches), f"{tag}: not the {arches} image of {profile.name}"


def test_the_image_recipes_build_tags_of_the_table():
    from grpo_deploy.image_build.recipes import RECIPES

    assert RECIPES["cpu"].tag == image_tags.CPU_TAG
    for name, recipe in RECIPES.items():
        assert recipe.tag is None or recipe.tag in image_tags.produced(), f"recipe {name}: {recipe.tag}"


def test_bake_builds_the_native_platform_by_default():
    """The docker driver refuses a multi-platform build without --push: both arches only when ARCHES asks."""
    variables = bake_variables()
    assert variables.get("ARCHES") == "", "ARCHES must default to empty (this machine's architecture)"
    params, result = bake_function("arches")
    assert "BAKE_LOCAL_PLATFORM" in result and f'{params[0]} != ""' in result
    text = bake_text()
    assert "linux/amd64,linux/arm64" not in text and "linux/arm64,linux/amd64" not in text
    for name, body in bake_targets().items():
        assert re.search(r'platforms\s*=\s*\["linux/\$\{arch\}"\]', body), f"{name}: one platform per target"
        assert re.search(r"matrix\s*=\s*\{\s*arch\s*=\s*arches\(ARCHES\)\s*\}", body), name


# --- CUDA arch list and the CUDA label -------------------------------------------------------------------------

ARCH_STAGED = [IMAGES / "vllm" / "Dockerfile", IMAGES / "verl" / "Dockerfile"]


def stage_env(text: str, stage: str) -> str:
    m = re.search(r"^FROM \S+ AS " + stage + r"\n(.*?)(?=^FROM )", text, re.S | re.M)
    assert m, f"no stage {stage}"
    return re.sub(r"\\\n", " ", m.group(1))


@pytest.mark.parametrize("dockerfile", ARCH_STAGED, ids=lambda p: p.relative_to(IMAGES).as_posix())
def test_arch_list_covers_every_profiles_gpu(dockerfile: Path):
    text = dockerfile.read_text()
    assert re.search(r"^FROM arch-\$\{TARGETARCH\}$", text, re.M), "the result must start from its arch's stage"
    for profile in map(profiles.load, profiles.names()):
        hw = profile.hardware
        if profile.accelerator != "cuda":
            continue
        for arch in {K8S_ARCH[a] for a in hw["arch"]}:
            env = stage_env(text, f"arch-{arch}")
            archs = re.search(r'TORCH_CUDA_ARCH_LIST="([^"]*)"', env).group(1).split()
            cc = hw["compute_capability"]
            want = {cc, cc + "a"} if float(cc) < 12.1 else {cc + "a"}  # GB10's arch-specific kernels need 12.1a
            assert want & set(archs), f"{profile.name}: sm {cc} missing from the {arch} arch list {archs}"
    arm = stage_env(text, "arch-arm64")
    assert "TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas" in arm, "DGX Spark: Triton must use the toolkit's ptxas"


@pytest.mark.parametrize("dockerfile", ARCH_STAGED, ids=lambda p: p.relative_to(IMAGES).as_posix())
def test_gpu_images_label_the_cuda_they_check(dockerfile: Path):
    text = dockerfile.read_text()
    name = dockerfile.parent.name
    assert re.search(r"^ARG CUDA=" + re.escape(image_tags.GPU_IMAGES[name].cuda) + "$", text, re.M)
    assert 'org.grpo-deploy.cuda-version="${CUDA}"' in text
    assert '/opt/grpo-deploy/bin/check-cuda.sh "${CUDA}"' in text


# --- bases pinned by digest, or listed as not verifiable -------------------------------------------------------

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# Upstream bases whose digest could not be verified from a source readable where this was written (no registry
# here): pin them on a connected machine. Every entry must still be in use; a pinned base must leave this list.
UNPINNED_BASES = {
    ("vllm/Dockerfile", "vllm/vllm-openai:v${VLLM_VERSION}"): "no vllm/vllm-openai:v0.31.0 digest verifiable here",
    ("verl/Dockerfile", "vllm/vllm-openai:v${VLLM_VERSION}"): "no vllm/vllm-openai:v0.24.0 digest verifiable here",
}


def bases() -> set[tuple[str, str]]:
    """(Dockerfile, base) for every ARG BASE_IMAGE default and every FROM that names an image directly."""
    out = set()
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        rel = dockerfile.relative_to(IMAGES).as_posix()
        stages = set(re.findall(r"^FROM \S+ AS (\S+)", text, re.M))
        out |= {(rel, b) for b in re.findall(r"^ARG BASE_IMAGE=(\S+)", text, re.M)}
        for ref in re.findall(r"^FROM (\S+)", text, re.M):
            if "$" not in ref and ref not in stages:
                out.add((rel, ref))
    return out


def test_bases_are_pinned_by_digest_or_listed():
    for rel, base in sorted(bases()):
        if base.startswith(image_tags.NAMESPACE + "/"):
            continue  # the kit's own images, built here (no registry digest exists)
        assert DIGEST.search(base) or (rel, base) in UNPINNED_BASES, f"{rel}: base {base} is not pinned by digest"
    stale = set(UNPINNED_BASES) - bases()
    assert not stale, f"UNPINNED_BASES lists bases no Dockerfile uses any more: {stale}"


# --- health check per role -------------------------------------------------------------------------------------

# images/cuda: one Dockerfile, ROLE build arg
IMAGE_ROLES = {"vllm": {"server"}, "trainer": {"trainer"}, "verl": {"head", "worker"}, "cpu": {"server", "trainer"},
               "cuda": {"server", "trainer"}, "verl-cpu": {"head", "worker"}, "verl-cuda": {"head", "worker"}}


def test_every_role_an_image_runs_is_a_role_health_knows():
    from grpo_deploy.engines import ENGINES

    assert set().union(*IMAGE_ROLES.values()) == {r for e in ENGINES.values() for r in e.roles}
    assert set().union(*IMAGE_ROLES.values()) <= set(health.ROLES)


@pytest.mark.parametrize("dockerfile", [d for d in DOCKERFILES if not d.name.endswith(".deps")],
                         ids=lambda p: p.relative_to(IMAGES).as_posix())
def test_healthcheck_runs_health_with_a_role_it_knows(dockerfile: Path):
    """The image's HEALTHCHECK (its own or its base's) runs grpo_deploy.runtime.health; the role it checks comes from
    --role or the image's GRPO_ROLE, and health must know it (a role it does not know can never turn healthy)."""
    name = dockerfile.parent.name
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    base = re.sub(r"\\\n", " ", (IMAGES / "vllm" / "Dockerfile").read_text()) if name == "trainer" else text
    check = re.search(r"^HEALTHCHECK .*CMD (\[.*\])$", base, re.M)
    assert check, f"{name}: no HEALTHCHECK"
    argv = yaml.safe_load(check.group(1))
    assert argv[:3] == ["python3", "-m", "grpo_deploy.runtime.health"]
    roles = {argv[argv.index("--role") + 1]} if "--role" in argv else set()
    roles |= set(re.findall(r"^ENV (?:.* )?GRPO_ROLE=(\w+)", text, re.M))
    if not roles:  # the cpu image serves both roles: the env file of each service sets GRPO_ROLE
        roles = IMAGE_ROLES[name]
    assert roles <= IMAGE_ROLES[name], f"{name} checks {roles}, runs {IMAGE_ROLES[name]}"
    assert roles <= set(health.ROLES), f"{name}: health knows {health.ROLES}, not {roles - set(health.ROLES)}"
