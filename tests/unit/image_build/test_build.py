"""grpo_deploy.image_build.build: cache keys of the dependency and code images, and the streamed build contexts."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from grpo_deploy.image_build import build
from grpo_deploy.image_build.recipes import RECIPES

DOCKERFILE = "# comment\nFROM ${BASE_IMAGE}\n\nRUN pip install x\n"


def test_deps_key_changes_with_the_lock_the_instructions_and_the_base():
    key = build.deps_key(b"a==1\n", DOCKERFILE, "grpo-deploy/debian:bookworm")
    assert key == build.deps_key(b"a==1\n", DOCKERFILE, "grpo-deploy/debian:bookworm"), "unchanged inputs, same key"
    assert key != build.deps_key(b"a==2\n", DOCKERFILE, "grpo-deploy/debian:bookworm")
    assert key != build.deps_key(b"a==1\n", DOCKERFILE + "RUN true\n", "grpo-deploy/debian:bookworm")
    assert key != build.deps_key(b"a==1\n", DOCKERFILE, "grpo-deploy/debian:other")


def test_deps_key_ignores_comments_and_blank_lines_of_the_dockerfile():
    edited = "# a new comment\n" + DOCKERFILE.replace("\n\n", "\n   \n\n# more\n")
    assert build.deps_key(b"a==1\n", edited, "b") == build.deps_key(b"a==1\n", DOCKERFILE, "b")


def test_deps_key_ignores_the_locks_comments():
    assert build.deps_key(b"# header\na==1\n\n", DOCKERFILE, "b") == build.deps_key(b"a==1\n", DOCKERFILE, "b")
    assert build.deps_key(b"a==1\n# b==2\n", DOCKERFILE, "b") != build.deps_key(b"a==1\nb==2\n", DOCKERFILE, "b")


def test_deps_tag_is_the_recipes_repository_with_a_deps_suffix():
    assert build.deps_tag(RECIPES["cpu"], "0123456789abcdef") == "grpo-deploy/cpu-deps:0123456789ab-amd64"
    arm64 = build.deps_tag(RECIPES["cuda-trainer-arm64"], "0123456789abcdef")
    assert arm64 == "grpo-deploy/cuda-deps:0123456789ab-arm64"


def test_code_key_changes_with_each_input_and_not_with_member_order():
    members = [("grpo_deploy/a.py", 0o644, "1" * 64), ("common/e.sh", 0o755, "2" * 64)]
    args = {"UID": "1000", "GID": "1000"}
    key = build.code_key(b"FROM x", members, "sha256:deps", args)
    assert key == build.code_key(b"FROM x", list(reversed(members)), "sha256:deps", dict(reversed(args.items())))
    assert key != build.code_key(b"FROM y", members, "sha256:deps", args)
    assert key != build.code_key(b"FROM x", [members[0], ("common/e.sh", 0o644, "2" * 64)], "sha256:deps", args)
    assert key != build.code_key(b"FROM x", [members[0], ("common/e.sh", 0o755, "3" * 64)], "sha256:deps", args)
    assert key != build.code_key(b"FROM x", members, "sha256:other", args)
    assert key != build.code_key(b"FROM x", members, "sha256:deps", {**args, "UID": "1001"})


def test_package_members_leave_out_caches_and_a_wheels_kit_copy(tmp_path: Path):
    pkg = tmp_path / "grpo_deploy"
    for rel in ("__init__.py", "runtime/x.py", "__pycache__/a.pyc", "runtime/__pycache__/x.pyc", "kit/images/a",
                "runtime/kit/keep.txt", "data.yaml"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(rel)
    names = [m.name for m in build.package_members(pkg)]
    assert names == ["grpo_deploy/__init__.py", "grpo_deploy/data.yaml", "grpo_deploy/runtime/x.py",
                     "grpo_deploy/runtime/kit/keep.txt"]


def test_stream_tar_yields_a_tar_of_the_members_with_fixed_owner_and_time(tmp_path: Path):
    src = tmp_path / "big.bin"
    src.write_bytes(b"z" * (3 * build.CHUNK + 5))
    members = [build.Member("Dockerfile", b"FROM x\n"), build.Member("wheels/big.bin", src, 0o600)]
    sent = [0]
    data = b"".join(build.stream_tar(members, sent))
    assert sent[0] == len(data) > 3 * build.CHUNK
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        infos = {i.name: i for i in tar.getmembers()}
        assert tar.extractfile("wheels/big.bin").read() == src.read_bytes()
        assert tar.extractfile("Dockerfile").read() == b"FROM x\n"
    assert infos["wheels/big.bin"].mode == 0o600 and {(i.mtime, i.uid) for i in infos.values()} == {(0, 0)}
    assert data == b"".join(build.stream_tar(members)), "the same members give the same bytes"


def test_a_reader_that_stops_early_does_not_hang_the_writer(tmp_path: Path):
    src = tmp_path / "big.bin"
    src.write_bytes(b"z" * (8 * build.CHUNK))
    stream = build.stream_tar([build.Member("big.bin", src)])
    next(stream)
    stream.close()  # the build failed after the first chunk: the generator and its pipe are closed
