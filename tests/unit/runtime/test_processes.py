"""A trainer of several processes (runtime.processes, and the entrypoint's launch): the accelerate launch and the ranks'
environment, the guards against accelerate's silent fallbacks, agreement over a real gloo group of two processes, and
the launcher resolving the resume target once before it becomes `accelerate launch`."""

import json
import os
import signal
import subprocess
import sys
import types

import pytest
import yaml

from grpo_deploy.runtime import processes, train
from grpo_deploy.runtime.config import parse_config
from grpo_deploy.runtime.metrics import read_events


def test_launch_argv_is_fsdp2_with_sharded_state_on_one_machine():
    argv = processes.launch_argv(2, "/etc/grpo-deploy/trainer.yaml", python="/usr/bin/python3")
    assert argv[:3] == ["/usr/bin/python3", "-m", "accelerate.commands.launch"]
    pairs = dict(zip(argv[3::], argv[4::], strict=False))
    assert pairs["--num_processes"] == "2" and pairs["--num_machines"] == "1" and pairs["--fsdp_version"] == "2"
    assert pairs["--fsdp_state_dict_type"] == "SHARDED_STATE_DICT" and "--use_fsdp" in argv
    assert argv[-4:] == ["-m", "grpo_deploy.runtime.train", "--config", "/etc/grpo-deploy/trainer.yaml"]
    for bad in (1, 0, processes.MAX_PROCESSES + 1):
        with pytest.raises(ValueError, match="is not from 2"):
            processes.launch_argv(bad, "/c.yaml")


def test_launch_env_marks_the_ranks_and_shares_the_cpu():
    env = processes.launch_env(2, "cpu", "/shared/ck/checkpoint-4", base={"PATH": "/bin"}, cpus=8)
    assert env == {"PATH": "/bin", processes.LAUNCHED_ENV: "1", processes.RESUME_ENV: "/shared/ck/checkpoint-4",
                   "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "4"}
    assert processes.launch_env(3, "cpu", None, base={"OMP_NUM_THREADS": "1"}, cpus=2)["OMP_NUM_THREADS"] == "1"
    cuda = processes.launch_env(2, "cuda", None, base={}, cpus=8)
    assert cuda == {processes.LAUNCHED_ENV: "1", processes.RESUME_ENV: ""}


def stand_in_trainer(num_processes, kind="FSDP", fsdp2=True, lora_sync=True):
    """A stand-in with the attributes check_group reads (a real group is formed in the rehearsal)."""
    accelerator = types.SimpleNamespace(num_processes=num_processes, distributed_type=types.SimpleNamespace(value=kind),
                                        is_fsdp2=fsdp2)
    return types.SimpleNamespace(accelerator=accelerator, _lora_sync=lora_sync)


def test_check_group_refuses_the_silent_fallbacks():
    processes.check_group(stand_in_trainer(2), 2)
    processes.check_group(stand_in_trainer(1, kind="NO", fsdp2=False, lora_sync=False), 1)
    with pytest.raises(processes.GroupError, match="group of 1 process.*not 2.*each rank would train alone"):
        processes.check_group(stand_in_trainer(1, kind="NO"), 2)
    with pytest.raises(processes.GroupError, match="chose MULTI_CPU, not FSDP2"):
        processes.check_group(stand_in_trainer(2, kind="MULTI_CPU", fsdp2=False), 2)
    with pytest.raises(processes.GroupError, match="merged \\(NCCL\\) weight sync"):
        processes.check_group(stand_in_trainer(2, lora_sync=False), 2)


AGREE = """
import os, sys, torch.distributed as dist
from grpo_deploy.runtime.processes import agree, rank
dist.init_process_group("gloo")
with open(os.path.join(sys.argv[2], f"rank{rank()}.txt"), "w") as out:
    out.write(f"{agree(rank() == int(sys.argv[1]))} {agree(False)}")
dist.destroy_process_group()
"""


def test_agree_over_a_real_gloo_group_of_two(tmp_path):
    """One rank's stop is every rank's stop; nobody's is nobody's (torchrun, two processes, gloo on loopback)."""
    script = tmp_path / "agree.py"
    script.write_text(AGREE)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), "1", str(tmp_path)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["True False", "True False"]
    assert processes.agree(True) is True and processes.agree(False) is False  # no group: the flag itself


@pytest.fixture()
def sigterm_restored():
    """train.main installs its SIGTERM handler; the test process gets the default back."""
    yield
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def write_config(tmp_path, **extra):
    raw = {"run_name": "x", "model": "/m", "metrics_path": str(tmp_path / "m.jsonl"), "processes": 2,
           "async_grpo": {"output_dir": str(tmp_path / "out")}, **extra}
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_launcher_quarantines_once_then_becomes_accelerate_launch(tmp_path, monkeypatch, sigterm_restored):
    out = tmp_path / "out"
    for step, whole in ((4, True), (8, False)):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        if whole:
            (out / f"checkpoint-{step}" / "rng_state_0.pth").write_bytes(b"r")
            (out / f"checkpoint-{step}" / "rng_state_1.pth").write_bytes(b"r")
            (out / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    execs = []

    class Execed(Exception):
        pass

    def record_exec(path, argv, env):  # stands in for os.execve: the real one would replace the test process
        execs.append((path, argv, env))
        raise Execed

    monkeypatch.setattr(train.os, "execve", record_exec)
    monkeypatch.delenv(processes.LAUNCHED_ENV, raising=False)
    path = write_config(tmp_path)
    with pytest.raises(Execed):
        train.main(["--config", str(path)])
    ((exe, argv, env),) = execs
    assert exe == sys.executable and argv[1:3] == ["-m", "accelerate.commands.launch"] and argv[-1] == str(path)
    assert env[processes.LAUNCHED_ENV] == "1" and env[processes.RESUME_ENV] == str(out / "checkpoint-4")
    assert (out / "quarantine" / "checkpoint-8").is_dir() and not (out / "checkpoint-8").exists()
    assert [e["event"] for e in read_events(str(tmp_path / "m.jsonl"))] == ["checkpoint_quarantine"]


def test_the_launcher_refuses_a_checkpoint_of_another_world_size_before_any_rank_starts(tmp_path, monkeypatch,
                                                                                      sigterm_restored):
    ck = tmp_path / "out" / "checkpoint-4"
    ck.mkdir(parents=True)
    (ck / "rng_state.pth").write_bytes(b"r")
    (ck / "trainer_state.json").write_text("{}")
    monkeypatch.setattr(train.os, "execve", lambda *a: pytest.fail("launched despite the refusal"))
    monkeypatch.delenv(processes.LAUNCHED_ENV, raising=False)
    assert train.main(["--config", str(write_config(tmp_path))]) == 1
    start, end = read_events(str(tmp_path / "m.jsonl"))
    assert (start["event"], end["event"], end["status"]) == ("run_start", "run_end", "error")
    assert "world_size 1 in the checkpoint, 2 in this run" in end["error"]


def test_a_rank_takes_the_launchers_resume_target_and_rank_1_writes_nothing(tmp_path, monkeypatch, sigterm_restored):
    seen = {}

    class Trained:
        state = types.SimpleNamespace(global_step=3)

        def train(self, resume_from_checkpoint=None):
            seen["resume"] = resume_from_checkpoint

    monkeypatch.setattr(train, "build_trainer", lambda config, sink: (Trained(), "shim"))
    monkeypatch.setenv(processes.LAUNCHED_ENV, "1")
    monkeypatch.setenv(processes.RESUME_ENV, "/shared/ck/checkpoint-4")
    monkeypatch.setenv("RANK", "1")
    config = parse_config(yaml.safe_load(write_config(tmp_path, unload_stale_adapters=False).read_text()))
    assert train.main(["--config", str(tmp_path / "trainer.yaml")]) == 0
    assert seen["resume"] == "/shared/ck/checkpoint-4" and config.processes == 2
    assert not (tmp_path / "m.jsonl").exists()  # rank 1 is silent: rank 0 speaks for the group
