"""Trainer entrypoint: `python3 -m grpo_deploy.runtime.trainer.train --config PATH` runs TRL's AsyncGRPOTrainer + LoRA.

Only light modules are imported at the top: TRL's rollout worker is a spawned process that re-imports this module as
`__mp_main__`, and nothing below the `__main__` guard may run there.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from grpo_deploy.common.metrics import MetricsSink, NullSink
from grpo_deploy.runtime.health import Heartbeat, heartbeat_path
from grpo_deploy.runtime.identity import apply_umask, identity
from grpo_deploy.runtime.storage import checkpoints
from grpo_deploy.runtime.storage.adapters import AdapterPublisher, resume_server, safe_keep, unload_stale
from grpo_deploy.runtime.storage.resume import resolve_resume
from grpo_deploy.runtime.tasks.data import build_dataset
from grpo_deploy.runtime.tasks.rewards import build_reward_funcs
from grpo_deploy.runtime.trainer import processes
from grpo_deploy.runtime.trainer.config import (
    ConfigError,
    RunConfig,
    build_grpo_kwargs,
    build_lora_config,
    load_config,
    response_template,
)
from grpo_deploy.runtime.watch.run_watch import STOPPED_EARLY

log = logging.getLogger("grpo_deploy.runtime.trainer.train")


class Terminated(SystemExit):
    """Raised from the SIGTERM handler so that cleanup and the run_end event happen on `docker stop`."""


def _on_sigterm(signum, frame):
    raise Terminated(f"terminated by signal {signum}")


def load_tokenizer(config: RunConfig):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model)
    template = response_template(config.response_template)
    if template is not None:
        tokenizer.response_template = template
    return tokenizer


def build_trainer(config: RunConfig, sink: MetricsSink):
    """Construct the trainer with every runtime adaptation in place; returns it and what the attention shim did."""
    import torch
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from grpo_deploy.runtime.storage import faults as storage_faults
    from grpo_deploy.runtime.trainer import attention_shim, trl_hooks
    from grpo_deploy.runtime.trainer.callbacks import MetricsCallback, ShareGuardCallback, WatcherCallback
    from grpo_deploy.runtime.trainer.disk_watchdog import DiskWatchdog

    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{config.source}: device: cuda, but this process sees no CUDA device")
    shim = attention_shim.install(config.attention_shim)
    log.info(shim)
    if config.device == "cpu":
        trl_hooks.neutralise_peak_flops()
        if config.world_size > 1:
            processes.fsdp_on_cpu()
    try:
        if trl_hooks.send_run_token():  # before the trainer: its __init__ already asks the server
            log.info("the run's token is sent with every call to the server (the kit's front asks for it)")
    except ValueError as error:  # run_token.RunTokenError: one line, the value never shown
        raise ConfigError(str(error)) from None
    try:
        args = AsyncGRPOConfig(**build_grpo_kwargs(config))
    except TypeError as error:
        raise ConfigError(f"{config.source}: async_grpo: {error}") from None
    trl_hooks.bound_score_queue(args, config.world_size)
    trainer = AsyncGRPOTrainer(
        model=config.model,
        reward_funcs=build_reward_funcs(config.rewards, config.max_completion_length),
        args=args,
        train_dataset=build_dataset(config.dataset, config.seed),
        processing_class=load_tokenizer(config),
        peft_config=build_lora_config(config),
        callbacks=[MetricsCallback(sink)],
    )
    processes.check_group(trainer, config.world_size)
    main = processes.is_main_rank()
    watch = watch_of(config, sink) if main and config.watch is not None else None
    if config.watch is not None:  # before the disk watchdog and the share guard: they judge the save it asks for
        trainer.add_callback(WatcherCallback(watch))
    if config.disk_watchdog is not None:
        trainer.add_callback(DiskWatchdog(config.output_dir, config.disk_watchdog, sink.emit))
    # rank 0 alone checks the share (its failure ends the group: the launcher stops the other ranks); the guard
    # writes its own marker, so a guard on another rank would overwrite rank 0's and trip it
    guard = storage_faults.ShareGuard(os.path.dirname(os.path.abspath(config.metrics_path)), os.getuid(), os.getgid(),
                                      newest=lambda: newest_complete(config)) if main else None
    if guard is not None:
        trainer.add_callback(ShareGuardCallback(guard.check))
    publisher = AdapterPublisher(sink.emit, config.lora_dir, safe_keep(config.adapters.keep, config.max_staleness),
                                 before_save=guard.check if guard is not None else None)
    trl_hooks.instrument_adapter_sync(trainer, publisher, served_check(config, sink, watch) if main else None)
    trl_hooks.token_for_rollouts(trainer)
    if main:
        trl_hooks.install_failpoints(trainer, config.output_dir, sink.emit)
    if config.speed != config.speed.__class__():
        from grpo_deploy.runtime.trainer import speed as trainer_speed

        switches = trainer_speed.Switches(**config.speed.model_dump())
        done = trainer_speed.apply(trainer.model, switches, config.device, autocast=bool(args.bf16))
        log.info("speed switches %s: %s", switches.label, done)
        if "lora_elementwise_none" in done:
            log.warning("lora_elementwise is on but changed nothing: %s", done["lora_elementwise_none"])
        sink.emit("speed_switches", switches=switches.label, **done)
    return trainer, shim


def watch_of(config: RunConfig, sink: MetricsSink):
    """The run watcher of rank 0, warmed up on the run's earlier steps (run_watch.read_history)."""
    from grpo_deploy.runtime.watch.run_watch import RunWatch, read_history

    return RunWatch(config.watch, sink.emit, read_history(config.metrics_path))


def served_check(config: RunConfig, sink: MetricsSink, watch):
    """Rank 0's served-policy check (served_policy.py): its findings go to the run watcher's inbox, or to the log
    when the run has no watcher (or watch.enabled is off)."""
    from grpo_deploy.runtime.trainer.served_policy import ServedPolicyCheck

    watching = watch is not None and watch.config.settings.enabled
    return ServedPolicyCheck(config.server_url, sink.emit, watch.report if watching else None)


def watcher_stop(trainer) -> tuple[str, str] | None:
    """(status, why) of run_end when the run watcher stopped training, else None; emits the watcher's summary."""
    from grpo_deploy.runtime.trainer.callbacks import WatcherCallback

    callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
    callback = next((c for c in callbacks if isinstance(c, WatcherCallback)), None)
    if callback is None or callback.watch is None:
        return None
    callback.watch.summary()
    if callback.stopped_at is None:
        return None
    return STOPPED_EARLY, f"run watcher: {callback.watch.stop.message} (stopped at step {callback.stopped_at})"


def resume_shape(config: RunConfig) -> checkpoints.Shape:
    """What a checkpoint must match to be resumed by this run (target modules only when listed: PEFT writes
    all-linear out as the module names it found)."""
    modules = config.lora.target_modules
    return checkpoints.Shape(config.lora.r, tuple(sorted(modules)) if isinstance(modules, list) else None,
                             config.world_size)


def newest_complete(config: RunConfig) -> str | None:
    """The newest complete checkpoint's path (what a resume would take), or None."""
    try:
        complete = [c for c in checkpoints.list_checkpoints(config.output_dir, "trl") if c.complete]
    except OSError:
        return None
    return complete[-1].path if complete else None


def note_quarantined(quarantined: list, sink: MetricsSink) -> None:
    """A log line and a `checkpoint_quarantine` event for each half-written checkpoint moved aside."""
    for item in quarantined:
        log.warning(f"quarantined half-written checkpoint {item.path} -> {item.moved_to}: {item.reason}")
        sink.emit("checkpoint_quarantine", path=item.path, moved_to=item.moved_to, reason=item.reason)


def storage_fault(config: RunConfig, exc: BaseException):
    """The shared-volume fault behind *exc* (grpo_deploy.runtime.storage.faults), or None."""
    from grpo_deploy.runtime.storage import faults as storage_faults

    roots = [config.output_dir, os.path.dirname(config.lora_dir), os.path.dirname(os.path.abspath(config.metrics_path))]
    return storage_faults.classify(exc, roots, os.getuid(), os.getgid(), newest_complete(config))


def run(config: RunConfig, sink: MetricsSink) -> int:
    """One training run, bracketed by run_start and run_end events; returns the exit code."""
    trainer, status, error, resumed_from = None, "ok", None, None
    try:
        try:
            if processes.launched():  # the launcher resolved it once, before the ranks started
                resumed_from, quarantined = os.environ.get(processes.RESUME_ENV) or None, []
            else:
                resumed_from, quarantined = resolve_resume(config.output_dir, config.resume,
                                                           expect=resume_shape(config))
        finally:
            sink.emit("run_start", run_name=config.run_name, **identity(), pid=os.getpid(), resumed_from=resumed_from,
                      objective=config.watch.objective if config.watch is not None else None)
        note_quarantined(quarantined, sink)
        trainer, shim = build_trainer(config, sink)
        if config.machines > 1:  # machines other than 0 take the target machine 0's launcher resolved
            resumed_from = processes.resume_from_rank0(resumed_from)
        if config.unload_stale_adapters and processes.is_main_rank():
            unloaded = unload_stale(config.server_url)
            if unloaded:
                log.info(f"unloaded stale adapters from the server: {unloaded}")
            sink.emit("adapter_unload_stale", names=unloaded)
        sink.emit("trainer_ready", attention_shim=shim, resumed_from=resumed_from)
        trainer.train(resume_from_checkpoint=resumed_from)
        callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
        tripped = next((c.tripped for c in callbacks if getattr(c, "tripped", None)), None)
        if tripped is not None:
            status, error = "disk-full", tripped.message
        elif (stopped := watcher_stop(trainer)) is not None:
            status, error = stopped
    except BaseException as exc:
        status = "error"
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        failure = getattr(getattr(trainer, "vllm_client", None), "last_failure", None)
        if failure:
            error = f"{error} [server said: {failure}]"
        fault = storage_fault(config, exc)
        if fault is not None:
            status, error = "storage-fault", fault.message
            sink.emit("storage_fault", kind=fault.kind, path=fault.path, message=fault.message,
                      step=trainer.state.global_step if trainer is not None else 0)
        log.error(f"run failed: {error}")
        if trainer is not None and processes.is_main_rank() and resume_server(config.server_url):
            log.info("sent POST /resume so that the server is not left paused")
        if not isinstance(exc, Exception | Terminated | KeyboardInterrupt):
            raise
    finally:
        steps = trainer.state.global_step if trainer is not None else 0
        sink.emit("run_end", status=status, error=error, steps=steps)
    return 0 if status in ("ok", STOPPED_EARLY) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.trainer.train",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="trainer config YAML")
    args = parser.parse_args(argv)
    apply_umask()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("trl").setLevel(os.environ.get("GRPO_TRL_LOG_LEVEL", "WARNING"))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    if config.world_size > 1 and not processes.launched():
        return launch(config, args.config)
    if not processes.is_main_rank():  # one voice: rank 0 writes the events; each machine's first rank its heartbeat
        logging.getLogger().setLevel(logging.WARNING)
        if not processes.is_local_main():
            return run(config, NullSink())
        heartbeat = Heartbeat(heartbeat_path(config.heartbeat_path)).start()
        try:
            return run(config, NullSink())
        finally:
            heartbeat.stop()
    heartbeat = Heartbeat(heartbeat_path(config.heartbeat_path)).start()
    try:
        with MetricsSink(config.metrics_path) as sink:
            return run(config, sink)
    finally:
        heartbeat.stop()


def launch(config: RunConfig, config_path: str) -> int:
    """Several processes: resolve the resume target once (quarantining half-written checkpoints before any rank
    starts), then become `accelerate launch` of the ranks (processes.launch_argv). A refused resume ends here, with
    the run_start/run_end events the single-process path writes. Across machines only machine 0 resolves (and
    writes events); a machine whose environment does not say where it is ends with one line, exit 2."""
    try:
        machine = processes.machine_from_env(config.machines)
        ifname = processes.socket_ifname(machine)
    except processes.MachineError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    if machine.rank > 0:
        return _exec_launch(config, config_path, None, machine, ifname)
    with MetricsSink(config.metrics_path) as sink:
        try:
            resumed_from, quarantined = resolve_resume(config.output_dir, config.resume,
                                                       expect=resume_shape(config))
        except Exception as exc:  # a refused resume, or the share failing under it: the same record as one process
            fault = storage_fault(config, exc)
            status, error = ("storage-fault", fault.message) if fault else ("error", f"{type(exc).__name__}: {exc}")
            log.error(f"run failed: {error}")
            sink.emit("run_start", run_name=config.run_name, **identity(), pid=os.getpid(), resumed_from=None)
            if fault is not None:
                sink.emit("storage_fault", kind=fault.kind, path=fault.path, message=fault.message, step=0)
            sink.emit("run_end", status=status, error=error, steps=0)
            return 1
        note_quarantined(quarantined, sink)
    return _exec_launch(config, config_path, resumed_from, machine, ifname)


def _exec_launch(config: RunConfig, config_path: str, resumed_from: str | None, machine: processes.Machine,
                 ifname: str) -> int:
    """Become `accelerate launch` of this machine's ranks."""
    argv = processes.launch_argv(config.processes, config_path, machine=machine)
    where = f" on machine {machine.rank} of {machine.count} (rendezvous {machine.main_address}:{machine.main_port}" \
        f"{', interface ' + ifname if ifname else ''})" if machine.count > 1 else ""
    log.info(f"launching {config.processes} trainer process{'es' if config.processes > 1 else ''}{where} (FSDP2"
             f"{', gloo on the CPU' if config.device == 'cpu' else ''}): {' '.join(argv[1:])}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, processes.launch_env(config.processes, config.device, resumed_from, machine=machine,
                                                  ifname=ifname))


if __name__ == "__main__":
    sys.exit(main())
