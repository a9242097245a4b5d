"""Tests of grpo_deploy.image_build.verify: the in-image check's expectations from the image's labels, and the emulated
CPU identity handed to a container of another architecture."""

from __future__ import annotations

from pathlib import Path

from grpo_deploy.image_build import verify


def test_verify_hands_the_labels_to_the_check_as_its_expectations():
    labels = {"org.grpo-deploy.uid": "1000", "org.grpo-deploy.gid": "1000", "org.grpo-deploy.image-role": "server",
              "org.grpo-deploy.cuda-version": "13.0", "org.grpo-deploy.vllm-version": "0.31.0"}
    env = verify.expectations(labels, uid=1001)
    assert env["EXPECT_UID"] == "1001" and env["EXPECT_GID"] == "1000"
    assert (env["EXPECT_ROLE"], env["EXPECT_CUDA"], env["EXPECT_VLLM"], env["EXPECT_TRL"]) == ("server", "13.0",
                                                                                                "0.31.0", "")


def test_the_emulated_cpu_identity_is_what_onednn_reads(tmp_path: Path):
    folder = verify.emulated_cpu_dir(tmp_path / "cpu", cpus=2)
    for n in (0, 1):
        assert (folder / f"cpu{n}/regs/identification/midr_el1").read_text().strip() == verify.EMULATED_MIDR
    assert (folder / "online").read_text() == "0-1\n"


def test_expectations_without_labels_are_empty_and_an_explicit_gid_wins():
    env = verify.expectations({}, gid=7)
    assert env["EXPECT_UID"] == "" and env["EXPECT_GID"] == "7"
    assert set(env) == {"EXPECT_UID", "EXPECT_GID", *verify.LABELS_TO_ENV}
    assert all(env[name] == "" for name in verify.LABELS_TO_ENV)


def test_the_emulated_cpu_dir_can_be_made_twice(tmp_path: Path):
    first = verify.emulated_cpu_dir(tmp_path / "cpu", cpus=4)
    assert verify.emulated_cpu_dir(tmp_path / "cpu", cpus=4) == first
    assert (first / "present").read_text() == "0-3\n" and (first / "cpu3/regs/identification/midr_el1").is_file()
