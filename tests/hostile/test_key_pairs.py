"""The door, round two (issue 22): keys that each pass alone but contradict each other are refused in one line
(file:line, the key, what is wrong, what to do; exit 2; nothing written), and each key of the pair alone still
renders."""

from __future__ import annotations

import pytest
import yaml

from tests.hostile.helpers import assert_refused, changed, render

H = ("hosts",)
# (name, base, the pair (path -> value), the key named, words of the message)
PAIRS = [
    ("publish on a host without a server", "gb10-pair", {H + (0, "publish"): "10.0.0.1"}, "hosts[0].publish",
     ("runs no server role",)),
    ("publish on verl, which publishes nothing", "a100-verl", {H + (0, "publish"): "10.0.0.1"}, "hosts[0].publish",
     ("publishes no port",)),
    ("publish where the trainer shares the host", "cpu", {H + (0, "publish"): "0.0.0.0"}, "hosts[0].publish",
     ("runs the trainer too", "ignored")),
    ("loopback publish, trainer elsewhere", "gb10-pair", {H + (1, "publish"): "127.0.0.1"}, "hosts[1].publish",
     ("loopback", "cannot reach")),
    ("IPv6 loopback publish, trainer elsewhere", "gb10-pair", {H + (1, "publish"): "::1"}, "hosts[1].publish",
     ("loopback",)),
    ("'local' and localhost", "gb10-pair", {H + (0, "address"): "local", H + (1, "address"): "localhost"},
     "hosts[1].address", ("is this machine",)),
    ("localhost before 'local'", "gb10-pair", {H + (0, "address"): "me@127.0.0.1:22", H + (1, "address"): "local"},
     "hosts[0].address", ("is this machine",)),
    ("resume from a path off the share", "cpu", {("checkpoints", "resume"): "/data/ckpt/checkpoint-4"},
     "checkpoints.resume", ("not under the shared volume",)),
    ("logger project with no logger", "cpu", {("logger", "project"): "p"}, "logger.project",
     ("logger.kind none reads no project",)),
    ("logger entity with tensorboard", "cpu", {("logger", "kind"): "tensorboard", ("logger", "entity"): "team"},
     "logger.entity", ("reads no entity",)),
    ("trl-async: project with mlflow", "cpu", {("logger", "kind"): "mlflow", ("logger", "project"): "p"},
     "logger.project", ("set logger.kind to wandb",)),
    ("verl: entity even with wandb", "a100-verl", {("logger", "kind"): "wandb", ("logger", "entity"): "team"},
     "logger.entity", ("none of its loggers",)),
    ("identity of another engine's role", "a100-verl", {("run", "roles", "server"): {"uid": 1000}},
     "run.roles.server", ("no host of this spec runs role 'server'",)),
    ("identity of a role no host runs", "a100-verl", {("run", "roles", "worker"): {"uid": 1000}},
     "run.roles.worker", ("no host of this spec runs role 'worker'",)),
    ("GPUs on a profile without any", "cpu", {H + (0, "gpus"): {"server": [0], "trainer": [1]}}, "hosts[0].gpus",
     ("has no GPUs",)),
    ("dataset.size on trl-async", "cpu", {("dataset", "size"): 1000}, "dataset.size",
     ("never reads it", "max_steps")),
    ("served name with the adapters' prefix", "cpu", {("model", "served_name"): "trl-policy-base"},
     "model.served_name", ("'trl-policy-'",)),
    ("replica ports past 65535", "cpu", {H + (0, "replicas"): 2, ("overrides", "vllm", "port"): 65535},
     "hosts[0].replicas", ("65535", "65534")),
    ("fp16 with bf16", "h200", {("overrides", "trl", "fp16"): True, ("overrides", "trl", "bf16"): True},
     "overrides.trl.fp16", ("at most one of fp16 and bf16",)),
    ("fp16 under a bf16 base (was a traceback)", "h200", {("overrides", "trl", "fp16"): True},
     "overrides.trl.fp16", ("base_dtype bf16 needs bf16 autocast",)),
    ("bf16 off under a bf16 base (was a traceback)", "h200", {("overrides", "trl", "bf16"): False},
     "overrides.trl.bf16", ("needs bf16 autocast",)),
    ("bf16 base on cpu (was a traceback)", "cpu", {("overrides", "runtime", "base_dtype"): "bf16"},
     "overrides.runtime.base_dtype", ("runtime.device is cpu",)),
    ("Liger on cpu (was a traceback)", "cpu", {("overrides", "runtime", "fused_kernels"): "liger"},
     "overrides.runtime.fused_kernels", ("needs runtime.device cuda",)),
    ("elementwise LoRA without compile (was a traceback)", "h200", {("overrides", "runtime", "compile_layers"): False},
     "overrides.runtime.compile_layers", ("lora_elementwise needs runtime.compile_layers",)),
    ("the trainer's resume argument", "cpu", {("overrides", "trl", "resume_from_checkpoint"): "/shared/x"},
     "overrides.trl.resume_from_checkpoint", ("checkpoints.resume",)),
]


@pytest.mark.parametrize(("base", "changes", "key", "words"), [p[1:] for p in PAIRS], ids=[p[0] for p in PAIRS])
def test_a_contradicting_pair_is_one_line_naming_the_key(tmp_path, base, changes, key, words):
    run, out = render(tmp_path, changed(base, changes))
    assert_refused(run, key=key, words=words)
    assert len(run.problems) == 1, run.err
    assert not out.exists()


# Each key of a refused pair, alone or beside a value that does not contradict it: renders.
ALONE = [
    ("publish on the server-only host", "gb10-pair", {H + (1, "publish"): "10.0.0.2"}),
    ("publish on all interfaces, server-only host", "gb10-pair", {H + (1, "publish"): "0.0.0.0"}),
    ("'local' beside another machine", "gb10-pair", {H + (0, "address"): "local"}),
    ("'local' beside a loopback SSH port of another machine (a container)", "gb10-pair",
     {H + (0, "address"): "local", H + (1, "address"): "localhost:2222"}),
    ("a loopback SSH address alone", "gb10-pair", {H + (1, "address"): "127.0.0.1"}),
    ("resume from a path on the share", "cpu",
     {("checkpoints", "resume"): "/shared/runs/old/checkpoints/checkpoint-4"}),
    ("resume from the same path with the share mounted there", "cpu",
     {("checkpoints", "resume"): "/data/ckpt/checkpoint-4", ("storage", "mount"): "/data"}),
    ("logger project and entity with wandb", "cpu",
     {("logger", "kind"): "wandb", ("logger", "project"): "p", ("logger", "entity"): "team"}),
    ("verl: project with tensorboard", "a100-verl", {("logger", "kind"): "tensorboard", ("logger", "project"): "p"}),
    ("logger kind alone", "cpu", {("logger", "kind"): "tensorboard"}),
    ("identity of a role a host runs", "a100-verl", {("run", "roles", "head"): {"umask": "0002"}}),
    ("GPUs on a GPU profile", "h200", {H + (0, "gpus"): {"server": [0], "trainer": [1]}}),
    ("dataset.size on verl", "a100-verl", {("dataset", "size"): 4096}),
    ("model.served_name on trl-async", "cpu", {("model", "served_name"): "policy"}),
    ("model.served_name on verl (an absolute model path needs one)", "a100-verl",
     {("model", "path"): "/shared/models/q", ("model", "served_name"): "q"}),
    ("a served name with the prefix elsewhere", "cpu", {("model", "served_name"): "my-trl-policy-base"}),
    ("the last port alone", "cpu", {("overrides", "vllm", "port"): 65535}),
    ("replicas on the top ports that exist", "cpu", {H + (0, "replicas"): 2, ("overrides", "vllm", "port"): 65534}),
    ("bf16 alone", "h200", {("overrides", "trl", "bf16"): True}),
    ("fp16 with an fp32 base", "h200",
     {("overrides", "trl", "fp16"): True, ("overrides", "runtime", "base_dtype"): "fp32"}),
    ("Liger on cuda", "h200", {("overrides", "runtime", "fused_kernels"): "liger"}),
    ("compile off with elementwise LoRA off", "h200",
     {("overrides", "runtime", "compile_layers"): False, ("overrides", "runtime", "lora_elementwise"): False}),
    ("checkpoints.resume alone", "cpu", {("checkpoints", "resume"): "never"}),
]


@pytest.mark.parametrize(("base", "changes"), [a[1:] for a in ALONE], ids=[a[0] for a in ALONE])
def test_each_key_alone_still_renders(tmp_path, base, changes):
    run, out = render(tmp_path, changed(base, changes))
    assert run.code == 0, run.err
    assert out.is_dir()


def test_fp16_alone_is_not_given_bf16_beside_it(tmp_path):
    """The kit turns bf16 on for cuda unless the spec says: not when it asks for fp16 (TRL refuses both)."""
    run, out = render(tmp_path, changed("h200", {("overrides", "trl", "fp16"): True,
                                                 ("overrides", "runtime", "base_dtype"): "fp32"}))
    assert run.code == 0, run.err
    grpo = yaml.safe_load((out / "config" / "trainer.yaml").read_text())["async_grpo"]
    assert grpo["fp16"] is True and "bf16" not in grpo
