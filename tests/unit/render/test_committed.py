"""Tests of grpo_deploy.render.committed: the committed renders (compose/ defaults, each k8s overlay's generated/) are
what the renderer makes now, each with its record; the overlays are the folders with a spec.yaml."""

from __future__ import annotations

import hashlib

from grpo_deploy.render import committed
from grpo_deploy.render import folder as render_folder


def digests(files: dict[str, str]) -> dict[str, str]:
    return {rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in files.items()}


def test_committed_renders_carry_a_current_record():
    for folder, files in committed.renders().items():
        assert render_folder.read_record(folder) == digests(files), \
            f"{folder}/{render_folder.RECORD}: make render-defaults"
        render_folder.check_tree(files, folder)  # a rewrite is accepted without adopting anything


def test_the_compose_defaults_are_config_files_and_the_env_file():
    files = committed.compose_files()
    assert ".env" in files and all(rel == ".env" or rel.startswith("rendered/config/") for rel in files)
    assert "rendered/config/server.env" in files


def test_overlays_are_the_folders_holding_a_spec(tmp_path):
    for name in ("b", "a", "no-spec"):
        (tmp_path / name).mkdir()
    (tmp_path / "a" / "spec.yaml").write_text("x")
    (tmp_path / "b" / "spec.yaml").write_text("x")
    (tmp_path / "file.yaml").write_text("x")
    assert committed.k8s_overlays(tmp_path) == [tmp_path / "a", tmp_path / "b"]
    assert committed.k8s_overlays(tmp_path / "absent") == []
