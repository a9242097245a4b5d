"""One test per class of bad value: root identities, YAML's type traps, system paths, keys the kit owns, unknown keys
near known ones, and numbers too large for plan's arithmetic. Each asserts exit 2 and the key and wording."""

from __future__ import annotations

import pytest

from tests.hostile.helpers import assert_refused, base_data, changed, cli, dump, render, write_spec


def _refused(tmp_path, base, changes, key, *words):
    run, out = render(tmp_path, changed(base, changes))
    assert_refused(run, key=key, words=words)
    assert not out.exists()
    return run


# ------------------------------------------------------------------ root

@pytest.mark.parametrize(("base", "path", "key"), [
    ("cpu", ("run", "uid"), "run.uid"),
    ("cpu", ("run", "gid"), "run.gid"),
    ("cpu", ("run", "roles", "server", "uid"), "run.roles.server.uid"),
    ("cpu", ("run", "roles", "trainer", "gid"), "run.roles.trainer.gid"),
    ("a100-verl", ("run", "roles", "head", "uid"), "run.roles.head.uid"),
])
def test_uid_or_gid_zero_is_refused(tmp_path, base, path, key):
    _refused(tmp_path, base, {path: 0}, key, "greater than or equal to 1, got 0")


# ------------------------------------------------------------------ YAML's type traps (written as YAML text)

@pytest.mark.parametrize(("base", "yaml_text", "key", "words"), [
    ("cpu", "run:\n  uid: on\n", "run.uid", ("got the boolean True", "quote the word or write the number")),
    ("cpu", "overrides:\n  vllm:\n    enforce_eager: \"no\"\n", "overrides.vllm.enforce_eager",
     ("valid boolean", "'no'")),
    ("cpu", "overrides:\n  runtime:\n    attention_shim: on\n", "overrides.runtime.attention_shim",
     ("True is not one of 'auto', 'on' or 'off'", "quote the word")),
    ("cpu", "overrides:\n  trl:\n    learning_rate: .inf\n", "overrides.trl.learning_rate", ("finite number",)),
    ("cpu", "overrides:\n  trl:\n    learning_rate: .nan\n", "overrides.trl.learning_rate", ("got nan",)),
    ("cpu", "overrides:\n  trl:\n    max_steps: null\n", "overrides.trl.max_steps", ("must be set (got null)",)),
    ("cpu", "overrides:\n  lora:\n    r: \"8\"\n", "overrides.lora.r", ("valid integer", "'8'")),
    ("cpu", "overrides:\n  trl:\n    learning_rate: 5e-3\n", "overrides.trl.learning_rate", ("write 5.0e-3",)),
    ("cpu", "run:\n  umask: 0022\n", "run.umask", ("octal", "'0022'")),
    ("cpu", "checkpoints:\n  keep: yes\n", "checkpoints.keep", ("boolean",)),
    ("a100-verl", "overrides:\n  verl:\n    actor_rollout_ref.rollout.n: off\n",
     "overrides.verl.actor_rollout_ref.rollout.n", ("boolean",)),
])
def test_yaml_type_traps_are_refused_by_key(tmp_path, base, yaml_text, key, words):
    from tests.hostile.helpers import base_data

    data = base_data(base)
    text = dump(data)
    # Replace the whole top-level section with the YAML text (keeping the rest of the spec as init wrote it).
    section = yaml_text.split(":", 1)[0]
    lines, out, skipping = text.splitlines(), [], False
    for line in lines:
        if line.startswith(f"{section}:"):
            skipping = True
            continue
        if skipping and (line.startswith(" ") or line.startswith("-")):
            continue
        skipping = False
        out.append(line)
    spec = write_spec(tmp_path, text="\n".join(out) + "\n" + yaml_text)
    run = cli(["render", "-f", str(spec), "-o", str(tmp_path / "render")], tmp_path)
    assert_refused(run, key=key, words=words)
    assert not (tmp_path / "render").exists()


# ------------------------------------------------------------------ system paths

@pytest.mark.parametrize(("path", "value", "words"), [
    (("storage", "mount"), "/etc", ("system directory",)),
    (("storage", "mount"), "/shared/../etc", ("not a normalised path",)),
    (("storage", "mount"), "/shared/./x", ("not a normalised path",)),
    (("storage", "mount"), "//shared", ("not a normalised path",)),
    (("storage", "mount"), "/shared:ro", ("contains ':'",)),
    (("storage", "mount"), "/shared$HOME", ("contains '$'",)),
    (("storage", "mount"), "/shared,x", ("contains ','",)),
    (("storage", "mount"), "/shared x", ("contains ' '",)),
    (("storage", "mount"), "/", ("system directory",)),
    (("storage", "mount"), "/proc/x", ("system directory",)),
    (("storage", "mount"), "/home/grpo", ("collides with /home/grpo",)),
    (("storage", "mount"), "/opt", ("system directory",)),
    (("storage", "mount"), "shared", ("not an absolute path",)),
    (("hosts", 0, "shared_dir"), "/", ("system directory",)),
    (("hosts", 0, "shared_dir"), "/etc/grpo", ("system directory",)),
    (("checkpoints", "dir"), "/shared/../etc/x", ("not a normalised path",)),
    (("checkpoints", "dir"), "/srv/ck", ("is not under the shared volume",)),
    (("checkpoints", "resume"), "latest", ("must be auto, never or an absolute checkpoint path",)),
])
def test_system_and_malformed_paths_are_refused(tmp_path, path, value, words):
    from grpo_deploy.spec import key_str

    _refused(tmp_path, "gb10-pair", {path: value}, key_str(path), *words)


# ------------------------------------------------------------------ keys the kit owns

@pytest.mark.parametrize(("base", "changes", "key", "words"), [
    ("cpu", {("overrides", "trl", "output_dir"): "/shared/x"}, "overrides.trl.output_dir", ("checkpoints.dir",)),
    ("cpu", {("overrides", "trl", "save_steps"): 5}, "overrides.trl.save_steps", ("checkpoints.save_every",)),
    ("cpu", {("overrides", "trl", "save_total_limit"): 5}, "overrides.trl.save_total_limit", ("checkpoints.keep",)),
    ("cpu", {("overrides", "trl", "report_to"): "wandb"}, "overrides.trl.report_to", ("logger.kind",)),
    ("cpu", {("overrides", "trl", "seed"): 3}, "overrides.trl.seed", ("run.seed",)),
    ("a100-verl", {("overrides", "verl", "trainer.save_freq"): 5}, "overrides.verl.trainer.save_freq",
     ("checkpoints.save_every",)),
    ("a100-verl", {("overrides", "verl", "trainer.default_local_dir"): "/x"},
     "overrides.verl.trainer.default_local_dir", ("checkpoints.dir",)),
    ("a100-verl", {("overrides", "verl", "trainer.nnodes"): 2}, "overrides.verl.trainer.nnodes", ("set by the kit",)),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--port=9"]}, "overrides.vllm.extra_args[0]",
     ("overrides.vllm.port",)),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--port", "9"]}, "overrides.vllm.extra_args[0]",
     ("overrides.vllm.port",)),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--port 9"]}, "overrides.vllm.extra_args[0]",
     ("overrides.vllm.port",)),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--max_model_len=9"]}, "overrides.vllm.extra_args[0]",
     ("--max-model-len", "overrides.vllm.max_model_len")),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--served-model-name=x"]}, "overrides.vllm.extra_args[0]",
     ("model.served_name",)),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--por=9"]}, "overrides.vllm.extra_args[0]",
     ("read by vLLM as --port",)),
    ("cpu", {("overrides", "vllm", "extra_args"): ["-tp=2"]}, "overrides.vllm.extra_args[0]",
     ("one GPU per server",)),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--max-log-len=5", "--model", "x"]},
     "overrides.vllm.extra_args[1]", ("model.path",)),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--device-memory-utilization=0.5"]}, "overrides.vllm.extra_args[0]",
     ("overrides.vllm.gpu_memory_utilization",)),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--no-enable-lora"]}, "overrides.vllm.extra_args[0]",
     ("always on",)),
    ("cpu", {("overrides", "vllm", "swap_space"): 4}, "overrides.vllm.swap_space",
     ("vLLM removed --swap-space", "remove the key")),
    ("cpu", {("overrides", "vllm", "extra_args"): ["--swap_space=4"]}, "overrides.vllm.extra_args[0]",
     ("vLLM removed --swap-space", "remove the argument")),
])
def test_kit_owned_settings_are_refused_with_the_setting_to_use(tmp_path, base, changes, key, words):
    _refused(tmp_path, base, changes, key, *words)


# ------------------------------------------------------------------ the memory split's input (one GPU for both roles)

@pytest.mark.parametrize(("value", "words"), [
    (0, ("greater than 0, got 0",)),
    (1.5, ("less than or equal to 1, got 1.5",)),
    (-1, ("greater than 0, got -1",)),
    (float("nan"), ("got nan",)),
    ("$x", ("valid number", "'$x'")),
])
def test_gpu_memory_utilization_out_of_range_is_refused_in_one_line(tmp_path, value, words):
    """vLLM's fraction of the GPU the trainer shares on h100: plan's split never sees a value outside (0, 1]."""
    run = _refused(tmp_path, "h100", {("overrides", "vllm", "gpu_memory_utilization"): value},
                   "overrides.vllm.gpu_memory_utilization", *words)
    assert len([line for line in run.err.splitlines() if line.startswith("  ")]) == 1, run.err


# ------------------------------------------------------------------ did you mean

@pytest.mark.parametrize(("base", "changes", "key", "suggestion"), [
    ("cpu", {("overrides", "trl", "learnin_rate"): 1.0e-5}, "overrides.trl.learnin_rate", "learning_rate"),
    ("cpu", {("run", "nmae"): "x"}, "run.nmae", "name"),
    ("cpu", {("storage", "mout"): "/shared"}, "storage.mout", "mount"),
    ("cpu", {("overrides", "vllm", "gpu_memory_utilisation"): 0.5}, "overrides.vllm.gpu_memory_utilisation",
     "gpu_memory_utilization"),
    ("cpu", {("overrides", "lora", "alhpa"): 8}, "overrides.lora.alhpa", "alpha"),
    ("cpu", {("checkpoints", "save_evry"): 5}, "checkpoints.save_evry", "save_every"),
])
def test_unknown_key_near_a_known_one_says_did_you_mean(tmp_path, base, changes, key, suggestion):
    _refused(tmp_path, base, changes, key, f"did you mean '{suggestion}'?")


# ------------------------------------------------------------------ numbers past plan's arithmetic

ARCH = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 100}


@pytest.mark.parametrize(("base", "changes", "key", "words"), [
    ("cpu", {("overrides", "trl", "max_steps"): 10**30}, "overrides.trl.max_steps", ("less than or equal to",)),
    ("a100-verl", {("overrides", "verl", "trainer.total_training_steps"): 10**30},
     "overrides.verl.trainer.total_training_steps", ("less than or equal to",)),
    ("a100-verl", {("dataset", "size"): 2**31 - 1}, "dataset.size",
     ("set overrides.verl.trainer.total_training_steps",)),
    ("a100-verl", {("dataset", "size"): 10**30}, "dataset.size", ("less than or equal to",)),
    ("cpu", {("checkpoints", "disk_margin_gb"): 1e308}, "checkpoints.disk_margin_gb", ("less than or equal to",)),
    ("cpu", {("run", "seed"): 2**64}, "run.seed", ("less than or equal to 4294967295",)),
    ("cpu", {("model", "architecture"): {**ARCH, "hidden_size": 10**30}}, "model.architecture.hidden_size",
     ("less than or equal to",)),
    ("cpu", {("model", "architecture"): {**ARCH, "hidden_size": -5}}, "model.architecture.hidden_size",
     ("greater than or equal to 1",)),
    ("cpu", {("model", "architecture"): {**ARCH, "vocab_size": True}}, "model.architecture.vocab_size",
     ("boolean",)),
    ("cpu", {("model", "architecture"): {"hidden_size": 64}}, "model.architecture.vocab_size", ("is required",)),
    ("cpu", {("model", "architecture"): {**ARCH, "hidden_sise": 3}}, "model.architecture.hidden_sise",
     ("did you mean 'hidden_size'?",)),
    ("cpu", {("overrides", "vllm", "env", "EXTRA_VAR"): float("inf")}, "overrides.vllm.env.EXTRA_VAR",
     ("finite number",)),
])
def test_numbers_plan_cannot_use_are_refused_not_a_traceback(tmp_path, base, changes, key, words):
    spec = write_spec(tmp_path, changed(base, changes))
    for argv in (["plan", "--json", "-f", str(spec)], ["render", "-f", str(spec), "-o", str(tmp_path / "render")]):
        assert_refused(cli(argv, tmp_path), key=key, words=words)


@pytest.mark.parametrize(("value", "words"), [
    (0, ("greater than 0",)),
    (-1, ("greater than 0",)),
    (1e400, ("less than or equal to 10000",)),  # YAML writes inf: no cost is infinite
    (20000, ("less than or equal to 10000",)),
    ("$(id)", ("valid number", "'$(id)'")),
    (True, ("boolean",)),
    ("3\n4", ("valid number",)),
])
def test_a_bad_gpu_hour_price_is_refused_in_one_line(tmp_path, value, words):
    """cost.gpu_hour: a positive finite number up to 10,000 (plan multiplies GPU-hours by it)."""
    spec = write_spec(tmp_path, changed("cpu", {("cost", "gpu_hour"): value}))
    for argv in (["plan", "--json", "-f", str(spec)], ["render", "-f", str(spec), "-o", str(tmp_path / "render")]):
        assert_refused(cli(argv, tmp_path), key="cost.gpu_hour", words=words)


@pytest.mark.parametrize("value", ["$(id)", "US D", "a\nb", True, "", "VERYLONGNAME1", "-USD"])
def test_a_bad_currency_is_refused_in_one_line(tmp_path, value):
    spec = write_spec(tmp_path, changed("cpu", {("cost", "gpu_hour"): 2.0, ("cost", "currency"): value}))
    assert_refused(cli(["plan", "-f", str(spec)], tmp_path), key="cost.currency")


def test_a_cost_section_needs_its_price(tmp_path):
    spec = write_spec(tmp_path, changed("cpu", {("cost", "currency"): "EUR"}))
    assert_refused(cli(["plan", "-f", str(spec)], tmp_path), key="cost.gpu_hour", words=("required",))


def test_a_model_architecture_given_in_full_is_planned(tmp_path):
    spec = write_spec(tmp_path, changed("cpu", {("model", "path"): "org/unknown-model",
                                                ("model", "architecture"): ARCH}))
    run = cli(["plan", "--json", "-f", str(spec)], tmp_path)
    assert run.code in (0, 1) and '"params":' in run.out, run.err


def test_a_null_override_is_a_value_not_nothing(tmp_path):
    """`overrides.vllm.max_num_batched_tokens: null` means vLLM's default even where the profile sets one."""
    spec = write_spec(tmp_path, changed("cpu", {("overrides", "vllm", "max_num_batched_tokens"): None}))
    run = cli(["render", "-f", str(spec), "-o", str(tmp_path / "render")], tmp_path)
    assert run.code == 0, run.err
    assert "--max-num-batched-tokens" not in (tmp_path / "render" / "config" / "server.args").read_text()


@pytest.mark.parametrize(("key", "value", "words"), [
    ("window", 0, ("greater than or equal to 5",)),
    ("window", 10**30, ("less than or equal to 10000",)),
    ("window", True, ("boolean",)),
    ("window", "$(id)", ("valid integer",)),
    ("patience", -1, ("greater than or equal to 0",)),
    ("min_gain", 0, ("greater than 0",)),
    ("min_gain", 1e400, ("less than or equal to 1000000",)),  # YAML writes inf
    ("min_gain", "0.1\n0.2", ("valid number",)),
    ("action", "shutdown", ("'warn' or 'stop'",)),
    ("action", "-stop", ("'warn' or 'stop'",)),
    ("cap_share", 1.5, ("less than or equal to 1",)),
    ("target_reward", float("nan"), ("finite number",)),
    ("ratio_band", [1.2, 0.8], ("0 < low < 1 < high",)),
    ("ratio_band", [0.8], ("two numbers [low, high]",)),
    ("enabled", "yes", ("valid boolean",)),
    ("patiense", 3, ("did you mean 'patience'?",)),
])
def test_a_bad_watch_setting_is_refused_in_one_line(tmp_path, key, value, words):
    """watch.*: the run watcher's knobs (runtime/watch/config.py), validated at the door like every section."""
    spec = write_spec(tmp_path, changed("cpu", {("watch", key): value}))
    for argv in (["plan", "--json", "-f", str(spec)], ["render", "-f", str(spec), "-o", str(tmp_path / "render")]):
        assert_refused(cli(argv, tmp_path), key=f"watch.{key}", words=words)
    assert not (tmp_path / "render").exists()


@pytest.mark.parametrize("value", ["eth0\n", "$(id)", "-eth0", "../eth0", "eth0;rm", "x" * 16, "", 7, True])
def test_a_trainer_host_interface_that_is_not_a_name_is_refused_in_one_line(tmp_path, value):
    """Several trainer hosts make a cluster: hosts[].interface reaches GLOO/NCCL_SOCKET_IFNAME in an env file."""
    data = base_data("cpu")
    data["hosts"] = [{**data["hosts"][0], "name": "a", "address": "10.0.0.1", "roles": ["trainer", "server"]},
                     {**data["hosts"][0], "name": "b", "address": "10.0.0.2", "roles": ["trainer"],
                      "interface": value}]
    run, out = render(tmp_path, data)
    assert_refused(run, key="hosts[1].interface")
    assert not out.exists()


@pytest.mark.parametrize("steps", [0, -1])
def test_a_run_counted_in_epochs_renders_with_no_planned_end(steps):
    """TRL takes max_steps 0 or -1 as 'count in epochs'. The watcher's planned end is then unknown (null), not 0:
    a 0 ended `render` in a traceback (found by test_any_value_at_any_key)."""
    import yaml

    from grpo_deploy.render import render_files
    from grpo_deploy.spec.resolve import resolve
    from tests.specs import loaded

    res = resolve(loaded("cpu", "trl-async", ("local",), overrides={"trl": {"max_steps": steps}}))
    config = yaml.safe_load(render_files(res)["config/trainer.yaml"])
    assert config["watch"]["total_steps"] is None and config["async_grpo"]["max_steps"] == steps
