"""The door, issue 44 item 7: the classes of the round-two probe set that passed silently, each refused in one line
(file:line, the key, what was wrong, how to fix; exit 2; nothing written)."""

from __future__ import annotations

import pytest

from tests.hostile.helpers import assert_refused, base_data, changed, cli, render, write_spec

V = ("overrides", "verl")
T = ("overrides", "trl")


@pytest.mark.parametrize("key", ["warmup_steps", "temperature", "top_k", "weight_decay"])
def test_a_boolean_where_a_trl_number_belongs_is_refused(tmp_path, key):
    run, out = render(tmp_path, changed("cpu", {T + (key,): True}))  # YAML `on`/`yes`/`true`: TRL would read 1
    assert_refused(run, key=f"overrides.trl.{key}", words=("the boolean", "write the number"))
    assert not out.exists()


@pytest.mark.parametrize(("base", "path"), [
    ("cpu", T + ("hub_token",)), ("a100-verl", V + ("trainer.wandb_api_key",)),
    ("a100-verl", V + ("+trainer.mlflow_password",)),
])
def test_a_credential_named_pass_through_key_with_a_literal_is_refused(tmp_path, base, path):
    run, out = render(tmp_path, changed(base, {path: "hf_literalValue123"}))
    assert_refused(run, key=".".join(path), words=("names a credential", "environment"))
    assert "hf_literal" not in run.err and not out.exists()


@pytest.mark.parametrize("key", ["fork_threshold_tokens"])
def test_a_token_count_is_not_a_credential(tmp_path, key):
    run, _ = render(tmp_path, changed("cpu", {T + (key,): 64}))
    assert run.code == 0, run.err


@pytest.mark.parametrize(("key", "words"), [
    ("++trainer.save_freq", ("checkpoints.save_every",)), ("+trainer.nnodes", ("set by the kit",)),
    ("++trainer.max_actor_ckpt_to_keep", ("checkpoints.keep",)),
    ("++trainer.n_gpus_per_node", ("the kit reads this key", "trainer.n_gpus_per_node")),
    ("~trainer.save_freq", ("not a Hydra key",)),  # already refused: `~` is no key the kit passes through
])
def test_hydra_prefixes_on_the_kits_own_keys_are_refused(tmp_path, key, words):
    run, out = render(tmp_path, changed("a100-verl", {V + (key,): 4}))
    assert_refused(run, key=f"overrides.verl.{key}", words=words)
    assert not out.exists()


@pytest.mark.parametrize(("base", "changes", "key"), [
    ("a100-verl", {V + ("actor_rollout_ref.model.path",): "Qwen/Other-7B"},
     "overrides.verl.actor_rollout_ref.model.path"),
    ("a100-verl", {V + ("++actor_rollout_ref.model.path",): "Qwen/Other-7B"},
     "overrides.verl.++actor_rollout_ref.model.path"),
    ("cpu", {("model", "path"): "Qwen/Qwen2.5-0.5B", ("overrides", "model", "path"): "Qwen/Other-7B"},
     "overrides.model.path"),
])
def test_two_keys_naming_different_models_are_refused(tmp_path, base, changes, key):
    run, out = render(tmp_path, changed(base, changes))
    assert_refused(run, key=key, words=("model.path",))
    assert not out.exists()


@pytest.mark.parametrize(("base", "path", "value", "words"), [
    ("cpu", T + ("deepspeed",), "/etc/passwd", ("not under the shared volume",)),
    ("cpu", T + ("deepspeed",), "../ds.json", ("not an absolute path", "shared volume")),
    ("cpu", T + ("fsdp_config",), "/data/fsdp.json", ("not under the shared volume",)),
    ("a100-verl", V + ("data.train_files",), ["/shared/a.parquet", "/data/b.parquet"], ("not under the shared",)),
])
def test_path_valued_pass_through_keys_off_the_share_are_refused(tmp_path, base, path, value, words):
    run, out = render(tmp_path, changed(base, {path: value}))
    assert_refused(run, key=".".join(path), words=words)
    assert not out.exists()


def test_path_valued_pass_through_keys_on_the_share_render(tmp_path):
    run, _ = render(tmp_path, changed("cpu", {T + ("deepspeed",): "/shared/ds.json"}))
    assert run.code == 0, run.err


def test_one_host_with_two_verl_roles_is_refused(tmp_path):
    data = base_data("a100-verl")
    data["hosts"][0]["roles"] = ["head", "worker"]
    run, out = render(tmp_path, data)
    assert_refused(run, key="hosts[0].roles", words=("head and worker", "keep one"))
    assert not out.exists()


@pytest.mark.parametrize("name", ["a:b", "a$b", "a#b", "a b"])
def test_a_render_folder_with_a_separator_is_refused(tmp_path, name):
    write_spec(tmp_path, base_data("h200"))  # its COMPOSE_FILE names a file in the render folder
    run = cli(["render", "-f", "spec.yaml", "-o", str(tmp_path / name)], tmp_path)
    assert_refused(run, words=("COMPOSE_FILE",))
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("target", ["/run/grpo", "/run"])
def test_a_render_folder_in_a_system_tree_is_refused(tmp_path, target):  # fixed in the floor-plan issue
    write_spec(tmp_path, base_data("cpu"))
    run = cli(["render", "-f", "spec.yaml", "-o", target], tmp_path)
    assert_refused(run, words=("system directory",))


def test_a_storage_mount_in_run_is_refused(tmp_path):
    run, out = render(tmp_path, changed("cpu", {("storage", "mount"): "/run/shared"}))
    assert_refused(run, key="storage.mount", words=("system directory",))
    assert not out.exists()


@pytest.mark.parametrize("path", [("run", "seed"), ("overrides", "trl", "warmup_steps")])
def test_a_secret_shaped_number_from_the_environment_is_refused(tmp_path, monkeypatch, path):
    monkeypatch.setenv("MY_API_KEY", "98765432")
    run, out = render(tmp_path, changed("cpu", {path: 98765432}))
    assert_refused(run, key=".".join(path), words=("$MY_API_KEY",))
    assert "98765432" not in run.err and not out.exists()
