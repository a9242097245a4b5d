"""Tests of grpo_deploy.names: the shared names are stated there only, and the data files that cannot import them
(compose/compose.yaml, the env templates) agree with them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from grpo_deploy import names, render, spec
from grpo_deploy.kit_data import kit_dir
from grpo_deploy.spec import new_spec, resolve

PACKAGE = Path(names.__file__).parent
# Literals that names.py states once: a module spelling one of them again is restating the fact.
RESTATED = [re.escape(v) for v in (names.RUN_LABEL, names.ROLE_LABEL, names.MANAGED_BY_LABEL, names.UID_LABEL,
                                   names.GID_LABEL, names.VLLM_VERSION_LABEL, names.CUDA_LABEL)]
RESTATED += [r'["\']\.grpo-deploy["\'/]', r'f["\']grpo-\{', r"READY_TIMEOUT_S = ", r"UP_RESTARTS = ",
             r'["\']compose\.(nfs|bind)?\.?yaml["\']']


def test_no_module_restates_a_shared_name():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "names.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if not code.strip().startswith(('"""', "'''")) or "=" in code:  # a docstring may name them
                found += [f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}" for p in RESTATED if re.search(p, code)]
    assert not found, "state these in grpo_deploy/names.py and import them:\n" + "\n".join(found)


def test_compose_file_labels_and_project_are_the_named_ones():
    data = yaml.safe_load((kit_dir("compose") / names.COMPOSE_BASE).read_text(encoding="utf-8"))
    assert data["name"] == "${COMPOSE_PROJECT_NAME:-" + names.project_name("rehearsal") + "}"
    for role, service in data["services"].items():
        labels = service["labels"]
        assert labels[names.MANAGED_BY_LABEL] == names.MANAGED_BY and labels[names.ROLE_LABEL] == role
        assert names.RUN_LABEL in labels
    assert {p.name for p in kit_dir("compose").glob("compose*.yaml")} == set(names.COMPOSE_FILES)


def test_rendered_env_files_name_the_compose_project():
    for engine, profile in (("trl-async", "cpu"), ("verl", "a100")):
        res = resolve.resolve(spec.loads(new_spec.spec_text(profile, engine)))
        env = next(text for rel, text in render.render_files(res).items() if rel.startswith("hosts/"))
        assert f"COMPOSE_PROJECT_NAME={names.project_name(res.spec.run.name)}\n" in env, engine
