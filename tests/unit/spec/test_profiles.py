"""Tests of grpo_deploy.spec.profiles: every profile file parses, carries a reason per value, and the seed facts."""

import pytest

from grpo_deploy.spec import profiles


def test_the_five_profiles_exist():
    assert profiles.names() == ["a100", "cpu", "gb10", "h100", "h200"]


@pytest.mark.parametrize("name", ["a100", "cpu", "gb10", "h100", "h200"])
def test_every_setting_has_a_reason(name):
    p = profiles.load(name)
    assert p.engines and p.hardware["arch"]
    for section, values in p.settings.items():
        for key, setting in values.items():
            assert len(setting.why) > 5, f"{name}: {section}.{key} has no reason"


def test_seed_values():
    a100, gb10, h200 = profiles.load("a100"), profiles.load("gb10"), profiles.load("h200")
    assert a100.value("verl", "actor_rollout_ref.rollout.tensor_model_parallel_size") == 1
    assert a100.value("verl", "actor_rollout_ref.rollout.gpu_memory_utilization") == 0.8
    assert a100.value("verl", "trainer.total_epochs") == 5 and a100.value("checkpoints", "keep") == 3
    assert gb10.value("vllm", "gpu_memory_utilization") == 0.6 and gb10.value("runtime", "attention_shim") == "on"
    assert gb10.value("trl", "token_budget") == 16384 and gb10.value("trl", "gradient_checkpointing") is False
    assert h200.value("lora", "r") == 1 and h200.value("trl", "learning_rate") == 4e-5
    assert h200.hardware["arch"] == ["x86_64"] and gb10.hardware["arch"][0] == "aarch64"


def test_unknown_profile_error_lists_known():
    with pytest.raises(profiles.ProfileError, match="a100, cpu, gb10, h100, h200"):
        profiles.load("b200")


def test_malformed_setting_rejected():
    with pytest.raises(profiles.ProfileError, match="must be"):
        profiles._parse("x", {"name": "x", "settings": {"trl": {"learning_rate": 0.1}}})


def test_engine_mismatch_names_the_profiles_that_fit():
    assert profiles.engine_mismatch(profiles.load("gb10"), "trl-async") is None
    msg = profiles.engine_mismatch(profiles.load("a100"), "trl-async")
    assert msg == ("profile 'a100' does not support engine 'trl-async' (it supports verl); "
                   "profiles for trl-async: cpu, gb10, h100, h200")


@pytest.mark.parametrize("name", ["a100", "cpu", "gb10", "h100", "h200"])
def test_kubernetes_gpu_products_name_the_profiles_gpu(name):
    """GPU Feature Discovery's nvidia.com/gpu.product is the nvidia-smi name with spaces as '-': each listed product
    must be the GPU that preflight accepts (gpu_name_contains); a GPU profile lists at least one, cpu none."""
    hw = profiles.load(name).hardware
    products = hw.get("k8s_gpu_products") or []
    if hw["accelerator"] != "cuda":
        assert not products
        return
    assert products and len(set(products)) == len(products)
    for product in products:
        assert product.startswith("NVIDIA-") and " " not in product
        assert hw["gpu_name_contains"] in product.replace("-", " "), (product, hw["gpu_name_contains"])


def test_gb10_and_h200_extend_the_shared_base_which_no_host_may_choose():
    gb10, h200 = profiles.load("gb10"), profiles.load("h200")
    assert gb10.extends == h200.extends == "_hf-recipe" and "_hf-recipe" not in profiles.names()
    assert gb10.engines == ("trl-async",) and gb10.settings["trl"]["max_steps"].profile == "_hf-recipe"
    assert gb10.settings["trl"]["gradient_accumulation_steps"].profile == "gb10"
    with pytest.raises(profiles.ProfileError, match="unknown profile '_hf-recipe'"):
        profiles.load("_hf-recipe")


def _folder(tmp_path, **files):
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text, encoding="utf-8")
    return tmp_path


BASE = ("name: base\nengines: [trl-async]\nhardware: {arch: [x86_64], gpus_per_host: 1}\nimages: {server: s:1}\n"
        "settings:\n  vllm:\n    env: {value: {A: '1'}, why: base env}\n    dtype: {value: bfloat16, why: base}\n")


def test_the_child_merges_over_the_parent_key_by_key_and_replaces_a_setting_whole(tmp_path):
    child = ("name: kid\nextends: base\nhardware: {gpus_per_host: 2}\nimages: {trainer: t:1}\n"
             "settings:\n  vllm:\n    env: {value: {}, why: kid env}\n")
    p = profiles._compose(_folder(tmp_path, base=BASE, kid=child), "kid")
    assert p.hardware == {"arch": ["x86_64"], "gpus_per_host": 2} and p.images == {"server": "s:1", "trainer": "t:1"}
    assert p.engines == ("trl-async",) and p.extends == "base"
    assert p.settings["vllm"]["env"] == profiles.Setting({}, "kid env", "kid")  # not {A: '1'}: value and why travel
    assert p.settings["vllm"]["dtype"] == profiles.Setting("bfloat16", "base", "base")


def test_an_inherited_value_says_which_profile_holds_it():
    from grpo_deploy import spec
    from grpo_deploy.spec import resolve

    res = resolve.resolve(spec.load("tests/render/h200-trl-async-single/spec.yaml"))
    assert res.origins["trl"]["max_steps"].source == "profile:h200 (from _hf-recipe)"
    assert res.origins["trl"]["queue_maxsize"].source == "profile:h200"


@pytest.mark.parametrize(("files", "message"), [
    ({"a": "name: a\nextends: nobody\n"}, r"/a\.yaml: extends: no profile 'nobody'; known: a$"),
    ({"a": "name: a\nextends: a\n"}, r"a\.yaml: extends: the profile extends itself; name another"),
    ({"a": "name: a\nextends: b\n", "b": "name: b\nextends: a\n"},
     r"/b\.yaml: extends: a -> b -> a is a cycle; remove one"),
    ({f"p{i}": f"name: p{i}\nextends: p{i + 1}\n" for i in range(5)} | {"p5": "name: p5\n"},
     r"p4\.yaml: extends: the chain p0 -> p1 -> p2 -> p3 -> p4 -> p5 is deeper than 4 parents"),
    ({"a": "name: a\nextends: \"b\\nc\"\n"}, r"extends: 'b\\nc' is not a profile name"),
    ({"a": "name: a\nextends: $HOME\n"}, r"extends: '\$HOME' is not a profile name"),
    ({"a": "name: a\nextends: ../etc/passwd\n"}, r"extends: '\.\./etc/passwd' is not a profile name"),
    ({"a": "name: a\nextends: '..'\n"}, r"extends: '\.\.' is not a profile name"),
    ({"a": "name: a\nextends: -rf\n"}, r"extends: '-rf' is not a profile name"),
    ({"a": "name: a\nextends: /abs/gb10\n"}, r"extends: '/abs/gb10' is not a profile name"),
    ({"a": "name: a\nextends: [b]\n"}, r"extends: \['b'\] is not a profile name"),
    ({"a": "name: a\nextends: " + "x" * 5000 + "\n"}, r"extends: 'x{59}\.\.\. is not a profile name"),
])
def test_a_bad_extends_is_one_line_naming_file_key_and_fix(tmp_path, files, message):
    with pytest.raises(profiles.ProfileError, match=message) as err:
        profiles._compose(_folder(tmp_path, **files), next(iter(files)))
    assert "\n" not in str(err.value)


def test_a_parent_that_is_a_link_out_of_the_folder_or_a_fifo_is_refused(tmp_path):
    import os

    (tmp_path / "profiles").mkdir()
    folder = _folder(tmp_path / "profiles", a="name: a\nextends: out\n", b="name: b\nextends: pipe\n")
    (tmp_path / "elsewhere.yaml").write_text("name: out\n", encoding="utf-8")
    (folder / "out.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    os.mkfifo(folder / "pipe.yaml")
    with pytest.raises(profiles.ProfileError, match=r"out\.yaml: is a link out of the profiles folder"):
        profiles._compose(folder, "a")
    with pytest.raises(profiles.ProfileError, match=r"pipe\.yaml: is not a regular file \(a FIFO"):
        profiles._compose(folder, "b")


def test_a_profile_file_is_read_bounded(tmp_path):
    folder = _folder(tmp_path, a="name: a\nextends: big\n", big="name: big\n" + "#" * (1 << 20))
    with pytest.raises(profiles.ProfileError, match=r"big\.yaml: the spec is \d+ bytes; the limit is 1 MiB"):
        profiles._compose(folder, "a")
