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

from grpo_deploy.common.metrics import read_events
from grpo_deploy.runtime.trainer import processes, train
from grpo_deploy.runtime.trainer.config import parse_config


def test_launch_argv_is_fsdp2_with_sharded_state_on_one_machine():
    argv = processes.launch_argv(2, "/etc/grpo-deploy/trainer.yaml", python="/usr/bin/python3")
    assert argv[:3] == ["/usr/bin/python3", "-m", "accelerate.commands.launch"]
    pairs = dict(zip(argv[3::], argv[4::], strict=False))
    assert pairs["--num_processes"] == "2" and pairs["--num_machines"] == "1" and pairs["--fsdp_version"] == "2"
    assert pairs["--fsdp_state_dict_type"] == "SHARDED_STATE_DICT" and "--use_fsdp" in argv
    assert argv[-4:] == ["-m", "grpo_deploy.runtime.trainer.train", "--config", "/etc/grpo-deploy/trainer.yaml"]
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
from grpo_deploy.runtime.trainer.processes import agree, rank
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
    monkeypatch.setenv("LOCAL_RANK", "1")
    config = parse_config(yaml.safe_load(write_config(tmp_path, unload_stale_adapters=False).read_text()))
    assert train.main(["--config", str(tmp_path / "trainer.yaml")]) == 0
    assert seen["resume"] == "/shared/ck/checkpoint-4" and config.processes == 2
    assert not (tmp_path / "m.jsonl").exists()  # rank 1 is silent: rank 0 speaks for the group


# ---------------------------------------------------------------- a trainer over several hosts (machines)

MACHINE_1 = {"GRPO_MACHINE_RANK": "1", "GRPO_MAIN_ADDRESS": "10.0.0.1", "GRPO_MAIN_PORT": "29500",
             "GRPO_NODE_IP": "10.0.0.2", "GRPO_SOCKET_IFNAME": ""}


def test_a_machine_reads_its_place_from_the_environment():
    assert processes.machine_from_env(1, {}) == processes.Machine()  # one machine needs nothing
    m = processes.machine_from_env(2, MACHINE_1)
    assert (m.count, m.rank, m.main_address, m.main_port, m.node_ip, m.ifname) == (2, 1, "10.0.0.1", 29500,
                                                                                     "10.0.0.2", "")
    assert processes.machine_from_env(2, {**MACHINE_1, "GRPO_MAIN_ADDRESS": "spark1"}).main_address == "spark1"


@pytest.mark.parametrize("name,value,words", [
    ("GRPO_MACHINE_RANK", "2", "machine rank from 0 to 1"), ("GRPO_MACHINE_RANK", "-1", "machine rank"),
    ("GRPO_MACHINE_RANK", "", "machine rank"), ("GRPO_MACHINE_RANK", "\u0661", "machine rank"),
    ("GRPO_MAIN_ADDRESS", "", "is not set"), ("GRPO_MAIN_ADDRESS", "a b", "IPv4 address or a host name"),
    ("GRPO_MAIN_ADDRESS", "-oProxy", "IPv4 address or a host name"), ("GRPO_MAIN_ADDRESS", "$(id)", "host name"),
    ("GRPO_MAIN_PORT", "0", "port from 1"), ("GRPO_MAIN_PORT", "70000", "port from 1"),
    ("GRPO_MAIN_PORT", "29500\n", "port"), ("GRPO_NODE_IP", "10.0.0", "IPv4 address"),
    ("GRPO_SOCKET_IFNAME", "eth0;rm", "interface name"), ("GRPO_SOCKET_IFNAME", "x" * 16, "interface name"),
])
def test_a_machine_environment_that_is_not_right_is_one_line_naming_the_variable(name, value, words):
    with pytest.raises(processes.MachineError, match=f"^{name}.*{words}"):
        processes.machine_from_env(2, {**MACHINE_1, name: value})


def test_launch_argv_across_machines_is_torchrun_s_static_rendezvous_at_machine_0():
    machine = processes.Machine(2, 1, "10.0.0.1", 29500)
    argv = processes.launch_argv(1, "/c.yaml", python="py", machine=machine)
    pairs = dict(zip(argv[3::], argv[4::], strict=False))
    assert (pairs["--num_processes"], pairs["--num_machines"], pairs["--machine_rank"]) == ("2", "2", "1")
    assert (pairs["--main_process_ip"], pairs["--main_process_port"], pairs["--rdzv_backend"]) == \
        ("10.0.0.1", "29500", "static")
    assert "--same_network" in argv and pairs["--fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    with pytest.raises(ValueError):
        processes.launch_argv(1, "/c.yaml", machine=processes.Machine(processes.MAX_MACHINES + 1, 0, "a"))


def test_launch_env_across_machines_names_the_rendezvous_and_the_interface_and_waits_for_rank_0s_resume():
    m0, m1 = processes.Machine(2, 0, "10.0.0.1"), processes.Machine(2, 1, "10.0.0.1")
    env0 = processes.launch_env(1, "cpu", "/ck/checkpoint-4", base={}, cpus=2, machine=m0, ifname="eth0")
    env1 = processes.launch_env(1, "cpu", None, base={}, cpus=2, machine=m1, ifname="eth0")
    assert env0[processes.RESUME_ENV] == "/ck/checkpoint-4" and env1[processes.RESUME_ENV] == processes.FROM_RANK0
    for env in (env0, env1):
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_the_socket_interface_is_the_named_one_or_the_one_holding_the_node_address():
    have = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.2"]}
    assert processes.socket_ifname(processes.Machine(), have) == ""
    assert processes.socket_ifname(processes.Machine(2, 1, "a", node_ip="10.0.0.2"), have) == "eth0"
    assert processes.socket_ifname(processes.Machine(2, 1, "a", ifname="lo"), have) == "lo"
    with pytest.raises(processes.MachineError, match="no network interface named ib0 on this host .*eth0, lo"):
        processes.socket_ifname(processes.Machine(2, 1, "a", ifname="ib0"), have)
    with pytest.raises(processes.MachineError, match="holds 10.9.9.9"):
        processes.socket_ifname(processes.Machine(2, 1, "a", node_ip="10.9.9.9"), have)


BROADCAST = """
import os, sys, torch.distributed as dist
from grpo_deploy.runtime.trainer import processes
dist.init_process_group("gloo")
mine = "/shared/ck/checkpoint-8" if processes.rank() == 0 else processes.FROM_RANK0
with open(os.path.join(sys.argv[1], f"rank{processes.rank()}.txt"), "w") as out:
    out.write(str(processes.resume_from_rank0(mine)))
dist.destroy_process_group()
"""


def test_machines_other_than_0_take_rank_0s_resume_target_over_a_real_gloo_group(tmp_path):
    script = tmp_path / "broadcast.py"
    script.write_text(BROADCAST)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["/shared/ck/checkpoint-8"] * 2
    assert processes.resume_from_rank0(processes.FROM_RANK0) is None  # no group: nothing to take it from


def test_a_machine_other_than_0_launches_without_resolving_or_writing(tmp_path, monkeypatch, sigterm_restored):
    """Only machine 0 quarantines and writes events: two launchers racing over one share would be worse."""
    out = tmp_path / "out"
    (out / "checkpoint-8").mkdir(parents=True)  # half-written: machine 0 would quarantine it, machine 1 leaves it
    execs = []

    class Execed(Exception):
        pass

    def record_exec(path, argv, env):
        execs.append((argv, env))
        raise Execed

    monkeypatch.setattr(train.os, "execve", record_exec)
    monkeypatch.delenv(processes.LAUNCHED_ENV, raising=False)
    for name, value in {**MACHINE_1, "GRPO_SOCKET_IFNAME": "lo"}.items():
        monkeypatch.setenv(name, value)
    path = write_config(tmp_path, processes=1, machines=2)
    with pytest.raises(Execed):
        train.main(["--config", str(path)])
    ((argv, env),) = execs
    assert argv[argv.index("--machine_rank") + 1] == "1" and env[processes.RESUME_ENV] == processes.FROM_RANK0
    assert (out / "checkpoint-8").is_dir() and not (tmp_path / "m.jsonl").exists()


def test_a_machine_whose_environment_is_wrong_ends_in_one_line_before_launching(tmp_path, monkeypatch, capsys,
                                                                             sigterm_restored):
    monkeypatch.setattr(train.os, "execve", lambda *a: pytest.fail("launched without knowing its place"))
    monkeypatch.delenv(processes.LAUNCHED_ENV, raising=False)
    for name, value in {**MACHINE_1, "GRPO_MACHINE_RANK": "7"}.items():
        monkeypatch.setenv(name, value)
    assert train.main(["--config", str(write_config(tmp_path, processes=1, machines=2))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: GRPO_MACHINE_RANK='7'") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.jsonl").exists()


def test_each_machine_s_first_rank_keeps_its_container_s_heartbeat(tmp_path, monkeypatch, sigterm_restored):
    beat, seen = tmp_path / "hb", []

    class Trained:
        state = types.SimpleNamespace(global_step=1)

        def train(self, resume_from_checkpoint=None):
            seen.append(beat.exists())

    monkeypatch.setattr(train, "build_trainer", lambda config, sink: (Trained(), "shim"))
    monkeypatch.setenv(processes.LAUNCHED_ENV, "1")
    monkeypatch.setenv(processes.RESUME_ENV, "")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")  # rank 1 is the first process of machine 1
    monkeypatch.setenv("GRPO_HEARTBEAT_FILE", str(beat))
    write_config(tmp_path, processes=1, machines=2, unload_stale_adapters=False)
    assert train.main(["--config", str(tmp_path / "trainer.yaml")]) == 0
    assert seen == [True] and not (tmp_path / "m.jsonl").exists()  # beating while it trains, gone after
