"""The trl-async engine's trainer processes: one FSDP2 group over runtime.trainer_processes on each trainer host
(machine 0 first: the rendezvous, rank 0, the metrics), each host's place in it, and the rules on the trainer's
process count and speed switches (with the spec key to name when a pair of settings breaks)."""

from __future__ import annotations

from typing import Any

from grpo_deploy.common.values import host_part
from grpo_deploy.engines.base import Engine, Resolved
from grpo_deploy.runtime.trainer.processes import MAIN_PORT


def override_key(section: str, key: str) -> tuple[Any, ...]:
    """The spec key a user changes to fix a broken rule (an override, whether or not it is written yet)."""
    return ("overrides", section, key)


def _fix_at(res: Resolved, *keys: tuple[str, str]) -> tuple[Any, ...]:
    """The spec key to name for a broken pair of settings (section, key): the first the spec overrides, else the
    first."""
    for section, key in keys:
        origin = res.origins[section].get(key)
        if origin is not None and origin.source == "override":
            return override_key(section, key)
    return override_key(*keys[0])


def check_trainer_switches(res: Resolved, problem) -> None:
    """The trainer's speed switches against its precision and device (the trainer config's own rules, said at the
    door with the key to change rather than as a traceback at render)."""
    trl, rt = res.settings.trl, res.settings.runtime
    cpu = rt.device == "cpu"
    autocast = not cpu and (trl.bf16 if trl.bf16 is not None else not trl.fp16)  # as trainer_config sets bf16
    if rt.base_dtype != "fp32" and not autocast:
        cause, why = (("runtime", "device"), "runtime.device is cpu") if cpu else \
            (("trl", "fp16"), "trl.fp16 is true") if trl.bf16 is None else (("trl", "bf16"), "trl.bf16 is false")
        problem(_fix_at(res, ("runtime", "base_dtype"), cause),
                f"runtime.base_dtype {rt.base_dtype} needs bf16 autocast and {why}: set overrides.runtime.base_dtype "
                f"to fp32, or {'run on cuda' if cpu else 'train in bf16'}")
    if rt.fused_kernels != "off" and rt.device != "cuda":
        problem(_fix_at(res, ("runtime", "fused_kernels"), ("runtime", "device")),
                f"runtime.fused_kernels {rt.fused_kernels} (Triton kernels) needs runtime.device cuda and it is "
                f"{rt.device}: set overrides.runtime.fused_kernels to off, or run on cuda")
    if rt.lora_elementwise and not rt.compile_layers:
        problem(_fix_at(res, ("runtime", "lora_elementwise"), ("runtime", "compile_layers")),
                "runtime.lora_elementwise needs runtime.compile_layers (eager, its broadcasts would be materialised): "
                "set overrides.runtime.lora_elementwise to false, or compile_layers to true")


def trainer_processes(res: Resolved) -> int:
    """Trainer processes on each trainer host: runtime.trainer_processes, else 1 (a several-GPU trainer is not the
    default until it has run on GPUs here)."""
    return res.settings.runtime.trainer_processes or 1


def trainer_hosts(res: Resolved) -> list:
    """The hosts with role trainer, in spec order: the first is machine 0 (the rendezvous, rank 0, the metrics)."""
    return res.hosts_with("trainer")


def trainer_machines(res: Resolved) -> int:
    return max(len(trainer_hosts(res)), 1)


def trainer_ranks(res: Resolved) -> int:
    """Ranks of the trainer's one process group: its processes on each trainer host."""
    return trainer_processes(res) * trainer_machines(res)


def machine_rank(res: Resolved, host) -> int:
    return next(k for k, h in enumerate(trainer_hosts(res)) if h.name == host.name)


def main_address(res: Resolved, resolved: dict[str, str] | None = None) -> str:
    """Machine 0's address as the other trainer hosts reach it: as the deployer found it (preflight's cluster check),
    else the host part of its spec address."""
    first = trainer_hosts(res)[0]
    if resolved and first.name in resolved:
        return resolved[first.name]
    return host_part(first.address)


def machine_of(res: Resolved, host, resolved: dict[str, str] | None = None) -> dict[str, Any] | None:
    """A trainer host's place when the trainer spans several (its host env file's GRPO_MACHINE_RANK ...), else None.
    *resolved*: each node's address as the deployer found it ({} for `render`: Gloo then finds the interface)."""
    if "trainer" not in host.roles or trainer_machines(res) < 2:
        return None
    return {"rank": machine_rank(res, host), "main_address": main_address(res, resolved), "main_port": MAIN_PORT,
            "node_ip": (resolved or {}).get(host.name, ""), "ifname": host.interface or ""}


def check_trainer_processes(engine: Engine, res: Resolved, problem) -> None:
    """On cuda at most one trainer process per trainer GPU on each trainer host (an FSDP2 rank owns one GPU); on cpu
    any count (gloo)."""
    n = trainer_processes(res)
    for host in trainer_hosts(res) if res.settings.runtime.device == "cuda" else []:
        gpus = engine.gpu_split(res, host).get("trainer")
        if gpus is not None and n > len(gpus):
            problem(override_key("runtime", "trainer_processes"),
                    f"runtime.trainer_processes is {n} but the trainer on {host.name} has {len(gpus)} GPU(s) "
                    f"({gpus}): FSDP2 runs one process per GPU; set it to {len(gpus)} or fewer, or give the trainer "
                    f"{n} GPUs (hosts[].gpus.trainer)")
            return
