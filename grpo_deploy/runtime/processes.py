"""A trainer of several processes: the `accelerate launch` (FSDP2, sharded state) the trainer entrypoint re-executes
itself under, this process's rank, the guards against accelerate's silent fallbacks, and agreement across ranks.

One trainer process needs none of this. With `processes: N > 1` in trainer.yaml, `grpo_deploy.runtime.train` resolves
the resume target once (quarantine included), then replaces itself with `accelerate launch` of N copies of itself;
each copy sees GRPO_TRAINER_LAUNCHED and trains as one rank of one process group (NCCL on GPUs, gloo on the CPU).

On the CPU, accelerate 1.15 keeps FSDP only for GPU-like distributed types: torchrun-launched CPU ranks become either
independent single-process trainers (no ACCELERATE_USE_CPU) or DDP (with it), and neither raises
(docs/notes/fsdp2-cpu-probe.md). `fsdp_on_cpu()` makes the CPU group FSDP2 as asked, and `check_group()` refuses any
other outcome before the first step.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

LAUNCHED_ENV = "GRPO_TRAINER_LAUNCHED"  # set on the ranks: the entrypoint does not launch again
RESUME_ENV = "GRPO_TRAINER_RESUME"  # the resume target the launcher resolved ("" = start fresh)
MAX_PROCESSES = 64
# FSDP2 with sharded state: with FULL_STATE_DICT, FSDP2 + PEFT saves only rank 0's shard of each adapter tensor.
FSDP_FLAGS = ("--use_fsdp", "--fsdp_version", "2", "--fsdp_state_dict_type", "SHARDED_STATE_DICT",
              "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP", "--fsdp_reshard_after_forward", "false",
              "--fsdp_cpu_ram_efficient_loading", "false", "--fsdp_offload_params", "false")


class GroupError(RuntimeError):
    """The process group is not the one asked for (accelerate fell back to something else)."""


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


def launch_argv(processes: int, config_path: str, python: str = sys.executable) -> list[str]:
    """`accelerate launch` of *processes* trainer ranks on this machine, FSDP2 with sharded checkpoints; every rank runs
    `-m grpo_deploy.runtime.train --config CONFIG_PATH`. One machine: the rendezvous is on loopback inside the
    trainer's container (its own network namespace; accelerate moves to a free port when 29500 is taken)."""
    if not 2 <= processes <= MAX_PROCESSES:
        raise ValueError(f"processes: {processes} is not from 2 to {MAX_PROCESSES}")
    return [python, "-m", "accelerate.commands.launch", "--num_processes", str(processes), "--num_machines", "1",
            "--machine_rank", "0", "--mixed_precision", "no", "--dynamo_backend", "no", *FSDP_FLAGS,
            "-m", "grpo_deploy.runtime.train", "--config", config_path]


def launch_env(processes: int, device: str, resume: str | None, base: Mapping[str, str] = os.environ,
               cpus: int | None = None) -> dict[str, str]:
    """The ranks' environment: the launched mark, the resolved resume target, and on the CPU accelerate's CPU switch
    and an even share of the cores per rank (unless OMP_NUM_THREADS is set)."""
    env = dict(base)
    env[LAUNCHED_ENV] = "1"
    env[RESUME_ENV] = resume or ""
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
