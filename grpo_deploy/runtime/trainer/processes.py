"""A trainer of several processes: the `accelerate launch` (FSDP2, sharded state) the trainer entrypoint re-executes
itself under, this process's rank, the guards against accelerate's silent fallbacks, and agreement across ranks.

One trainer process needs none of this. With `processes: N > 1` (or `machines: M > 1`) in trainer.yaml,
`grpo_deploy.runtime.trainer.train` resolves the resume target once (quarantine included), then replaces itself with
`accelerate launch` of N copies of itself; each copy sees GRPO_TRAINER_LAUNCHED and trains as one rank of one process
group (NCCL on GPUs, gloo on the CPU) of N x M ranks.

Across trainer hosts (machines), each host's container runs on the host's network and learns its place from the
environment its host's compose file gives it (GRPO_MACHINE_RANK, GRPO_MAIN_ADDRESS, GRPO_MAIN_PORT, GRPO_NODE_IP,
GRPO_SOCKET_IFNAME: `machine_from_env`). Only machine 0's launcher resolves the resume target (two quarantines racing
on one share would be worse than none); the others' ranks take it from rank 0 once the group has formed
(`resume_from_rank0`).

On the CPU, accelerate 1.15 keeps FSDP only for GPU-like distributed types: torchrun-launched CPU ranks become either
independent single-process trainers (no ACCELERATE_USE_CPU) or DDP (with it), and neither raises
(docs/notes/fsdp2-cpu-probe.md). `fsdp_on_cpu()` makes the CPU group FSDP2 as asked, and `check_group()` refuses any
other outcome before the first step.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from grpo_deploy.runtime.net import socket_interface

LAUNCHED_ENV = "GRPO_TRAINER_LAUNCHED"  # set on the ranks: the entrypoint does not launch again
RESUME_ENV = "GRPO_TRAINER_RESUME"  # the resume target the launcher resolved ("" = start fresh)
MAX_PROCESSES = 64
MAX_MACHINES = 16
MAIN_PORT = 29500
"""The rendezvous port on machine 0 (torchrun's static rendezvous store; accelerate's default)."""
FROM_RANK0 = "@rank0"
"""RESUME_ENV on machines other than 0: the resume target comes from rank 0 once the group has formed."""
MACHINE_ENV = ("GRPO_MACHINE_RANK", "GRPO_MAIN_ADDRESS", "GRPO_MAIN_PORT", "GRPO_NODE_IP", "GRPO_SOCKET_IFNAME")
"""What a trainer host's compose file gives its trainer container when the trainer spans hosts."""
# FSDP2 with sharded state: with FULL_STATE_DICT, FSDP2 + PEFT saves only rank 0's shard of each adapter tensor.
FSDP_FLAGS = ("--use_fsdp", "--fsdp_version", "2", "--fsdp_state_dict_type", "SHARDED_STATE_DICT",
              "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP", "--fsdp_reshard_after_forward", "false",
              "--fsdp_cpu_ram_efficient_loading", "false", "--fsdp_offload_params", "false")


class GroupError(RuntimeError):
    """The process group is not the one asked for (accelerate fell back to something else)."""


_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})", re.ASCII)  # also an IPv4 address
_IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,14}", re.ASCII)


class MachineError(ValueError):
    """The environment does not say where this machine is (one line: which variable, what was wrong)."""


@dataclass(frozen=True)
class Machine:
    """This trainer host's place among `count` trainer hosts, from its environment."""

    count: int = 1
    rank: int = 0
    main_address: str = ""
    main_port: int = MAIN_PORT
    node_ip: str = ""
    ifname: str = ""


def machine_from_env(count: int, env: Mapping[str, str] = os.environ) -> Machine:
    """This machine among *count* (trainer.yaml's `machines`); one machine needs nothing from the environment.
    MachineError naming the variable when a value is missing or not what it must be."""
    if count == 1:
        return Machine()
    rank_s, address, port_s, node_ip, ifname = (env.get(name, "") for name in MACHINE_ENV)
    if not rank_s.isascii() or not rank_s.isdigit() or not 0 <= int(rank_s) < count:
        raise MachineError(f"{MACHINE_ENV[0]}={rank_s!r}: must be a machine rank from 0 to {count - 1}")
    if not address:
        raise MachineError(f"{MACHINE_ENV[1]} is not set: the address machine 0 is reached at")
    if not _HOSTNAME.fullmatch(address):
        raise MachineError(f"{MACHINE_ENV[1]}={address!r}: must be an IPv4 address or a host name")
    if node_ip:
        try:
            ipaddress.IPv4Address(node_ip)
        except ValueError:
            raise MachineError(f"{MACHINE_ENV[3]}={node_ip!r}: must be an IPv4 address") from None
    if not port_s.isascii() or not port_s.isdigit() or not 1 <= int(port_s) <= 65535:
        raise MachineError(f"{MACHINE_ENV[2]}={port_s!r}: must be a port from 1 to 65535")
    if ifname and not _IFNAME.fullmatch(ifname):
        raise MachineError(f"{MACHINE_ENV[4]}={ifname!r}: not a network interface name")
    return Machine(count, int(rank_s), address, int(port_s), node_ip, ifname)


def socket_ifname(machine: Machine, addresses: dict[str, list[str]] | None = None) -> str:
    """The interface Gloo and NCCL use between machines: the one named, else the one holding the node's address
    ("" on one machine: loopback). MachineError when neither is on this host."""
    if machine.count == 1 or not (machine.ifname or machine.node_ip):
        return ""
    try:
        return socket_interface(machine.ifname, machine.node_ip, addresses)
    except ValueError as error:
        raise MachineError(str(error)) from None


def rank() -> int:
    """This process's global rank (0 when not launched as one of several)."""
    return _env_int("RANK", 0)


def is_main_rank() -> bool:
    return rank() == 0


def launched() -> bool:
    """True in a rank that `launch_argv` started (it must not launch again)."""
    return os.environ.get(LAUNCHED_ENV) == "1"


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def launch_argv(processes: int, config_path: str, python: str = sys.executable,
                machine: Machine = Machine()) -> list[str]:
    """`accelerate launch` of *processes* trainer ranks on this machine (of `machine.count`), FSDP2 with sharded
    checkpoints; every rank runs `-m grpo_deploy.runtime.trainer.train --config CONFIG_PATH`. One machine: the
    rendezvous is on loopback inside the trainer's container (its own network namespace; accelerate moves to a free
    port when 29500 is taken). Several: torchrun's static rendezvous at machine 0's address and port, this
    machine's rank given."""
    if not 1 <= machine.count <= MAX_MACHINES or not 1 <= processes <= MAX_PROCESSES \
            or processes * machine.count < 2:
        raise ValueError(f"processes: {processes} on {machine.count} machine(s) is not from 2 to {MAX_PROCESSES} "
                         f"ranks on 1 to {MAX_MACHINES} machines")
    where = ["--main_process_ip", machine.main_address, "--main_process_port", str(machine.main_port),
             "--same_network", "--rdzv_backend", "static"] if machine.count > 1 else []
    return [python, "-m", "accelerate.commands.launch", "--num_processes", str(processes * machine.count),
            "--num_machines", str(machine.count), "--machine_rank", str(machine.rank), *where,
            "--mixed_precision", "no", "--dynamo_backend", "no", *FSDP_FLAGS,
            "-m", "grpo_deploy.runtime.trainer.train", "--config", config_path]


def launch_env(processes: int, device: str, resume: str | None, base: Mapping[str, str] = os.environ,
               cpus: int | None = None, machine: Machine = Machine(), ifname: str = "") -> dict[str, str]:
    """The ranks' environment: the launched mark, the resolved resume target (FROM_RANK0 on machines other than 0),
    on the CPU accelerate's CPU switch and an even share of the cores per rank (unless OMP_NUM_THREADS is set), and
    across machines the rendezvous address (accelerate's CPU path reads MASTER_ADDR) and Gloo's and NCCL's
    interface."""
    env = dict(base)
    env[LAUNCHED_ENV] = "1"
    env[RESUME_ENV] = (resume or "") if machine.rank == 0 else FROM_RANK0
    if machine.count > 1:
        env.update(MASTER_ADDR=machine.main_address, MASTER_PORT=str(machine.main_port))
        if ifname:
            env.update(GLOO_SOCKET_IFNAME=ifname, NCCL_SOCKET_IFNAME=ifname)
    if device == "cpu":
        env["ACCELERATE_USE_CPU"] = "true"
        cores = cpus if cpus is not None else len(os.sched_getaffinity(0))
        env.setdefault("OMP_NUM_THREADS", str(max(1, cores // processes)))
    return env


def fsdp_on_cpu() -> None:
    """Keep FSDP on CPU ranks (accelerate 1.15 leaves a CPU group MULTI_CPU, i.e. DDP, whatever the plugin says).

    Both shared states are set: every AcceleratorState() re-copies PartialState's, and a checkpoint save that sees
    MULTI_CPU takes the unsharded path and fails. Idempotent."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if getattr(AcceleratorState.__init__, "_grpo_fsdp_on_cpu", False):
        return
    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    init._grpo_fsdp_on_cpu = True
    AcceleratorState.__init__ = init


def check_group(trainer, expected: int) -> None:
    """Refuse a group other than FSDP2 over *expected* ranks, and merged (NCCL) weight sync with several ranks (it
    hangs in TRL 1.16: trl #6797, #7103)."""
    accelerator = trainer.accelerator
    kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
    if accelerator.num_processes != expected:
        raise GroupError(f"accelerate formed a group of {accelerator.num_processes} process(es), not {expected} "
                         f"(distributed type {kind}): each rank would train alone")
    if expected > 1 and not (kind == "FSDP" and getattr(accelerator, "is_fsdp2", False)):
        raise GroupError(f"accelerate chose {kind}, not FSDP2, for {expected} trainer processes")
    if expected > 1 and getattr(trainer, "_lora_sync", True) is False:
        raise GroupError("the server offers no runtime LoRA, so TRL chose merged (NCCL) weight sync, which hangs with "
                         "several trainer processes in TRL 1.16: serve with LoRA enabled or use one trainer process")


def resume_from_rank0(resume: str | None) -> str | None:
    """The resume target every rank takes: the launcher's, except on machines other than 0 (FROM_RANK0), whose
    ranks take rank 0's over the group (a broadcast: every rank must call this once the group has formed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None if resume == FROM_RANK0 else resume
    box = [resume if is_main_rank() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def is_local_main() -> bool:
    """True in the first process of this machine (it keeps the container's heartbeat)."""
    return _env_int("LOCAL_RANK", 0) == 0


def agree(flag: bool) -> bool:
    """True on every rank when it is true on any (a stop decided by one rank must stop them all, or the others wait in
    the next collective forever). Without a process group: the flag itself."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return flag
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
