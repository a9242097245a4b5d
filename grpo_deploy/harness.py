"""The one-host harness: a trl-async spec rendered by the kit and both roles started from the rendered files as
processes, the way the images' entrypoints start them (`runtime.serve --args-file`, `runtime.train --config`), on
one GPU (or on CPU); it trains and reports what a user would ask of a first GPU run.

For a machine without Docker (the GPU machine the kit is measured on): `python3 -m grpo_deploy.harness --shape
rehearsal --out DIR`. The one thing it changes in the render is the server's address in the trainer's config: compose
names the server `server`, which only Docker's network resolves; here the server is on loopback.

Shapes: `rehearsal` is the cpu profile's task (tiny model, brevity reward, LoRA r8) on this machine's profile; `seed004`
is the profile's own recipe (Qwen2.5-Math-1.5B's architecture with random weights, LoRA r1 on every linear layer, 8
answers x 16 prompts) with answers held at `--answer-tokens` (a random-weight model almost never samples its end token
among 151,936, so the cap sets the length). Several `--trial`s share one server when their server arguments agree.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_deploy import status
from grpo_deploy.common.metrics import read_events
from grpo_deploy.diagnose.base import step_events
from grpo_deploy.diagnose.trl_async import diagnose
from grpo_deploy.engines.trl_async import TRL_ASYNC
from grpo_deploy.harness_memory import MemoryWatch
from grpo_deploy.render import render_files
from grpo_deploy.render.folder import parse_env, write_tree
from grpo_deploy.runtime import health
from grpo_deploy.spec import profiles
from grpo_deploy.spec.load import load
from grpo_deploy.spec.resolve import resolve
from grpo_deploy.spec.schema import SpecError
from grpo_deploy.templating import RenderError

SHAPES = ("rehearsal", "seed004")
SWITCHES_OFF = {"base_dtype": "fp32", "compile_layers": False, "lora_elementwise": False}
# The switches off on an 80 GB card: the fp32-master trainer's measured peak (58.7 GiB at 16,384 tokens, bench trainer,
# docs/MEASUREMENTS.md) does not fit beside vLLM's 0.3; at 0.18 vLLM still holds ~350k tokens of KV cache, twice what
# 128 answers of 1,300 tokens need in flight.
SWITCHES_OFF_VLLM_MEMORY = 0.18
RECIPE_ANSWERS = 128  # seed 004: 8 answers x 16 prompts per optimizer step
LOCAL = "127.0.0.1"
POLL_S = 2.0


@dataclass(frozen=True)
class Trial:
    """One training run of the harness: its shape, steps, answer length and whether the speed switches are on."""

    shape: str
    steps: int
    answer_tokens: int = 1300
    switches: bool = True

    @property
    def name(self) -> str:
        tail = f"-{self.answer_tokens}" if self.shape == "seed004" else ""
        return f"gpu-{self.shape}{tail}-{'on' if self.switches else 'off'}"


def parse_trial(text: str) -> Trial:
    """`SHAPE:STEPS[:ANSWER_TOKENS[:on|off]]`, e.g. `seed004:20:1300:on`."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 4 or parts[0] not in SHAPES:
        raise argparse.ArgumentTypeError(f"{text!r}: expected SHAPE:STEPS[:ANSWER_TOKENS[:on|off]], SHAPE one of "
                                         f"{', '.join(SHAPES)}")
    try:
        steps, tokens = int(parts[1]), int(parts[2]) if len(parts) > 2 else 1300
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: steps and answer tokens are whole numbers") from None
    if not (1 <= steps <= 2000 and 16 <= tokens <= 3000) or (len(parts) == 4 and parts[3] not in ("on", "off")):
        raise argparse.ArgumentTypeError(f"{text!r}: steps 1-2000, answer tokens 16-3000, switches on or off")
    return Trial(parts[0], steps, tokens, len(parts) < 4 or parts[3] == "on")


ONE_GPU_PROFILE = "h100"  # the one-GPU shape's split (vLLM's share) for a profile made for several GPUs per host


def seconds(text: str) -> float:
    """A timeout: a finite number of seconds from 1 to a day."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 <= value <= 86400:  # nan fails too
        raise argparse.ArgumentTypeError(f"{text!r}: seconds from 1 to 86400")
    return value


def device_profile(gpu_name: str | None) -> str:
    """The profile whose `gpu_name_contains` is in the GPU's name, a one-GPU profile first; cpu without a GPU."""
    if not gpu_name:
        return "cpu"
    found = [p for p in map(profiles.load, profiles.names())
             if p.hardware.get("gpu_name_contains") and p.hardware["gpu_name_contains"] in gpu_name]
    if not found:
        raise SystemExit(f"harness: no profile matches GPU {gpu_name!r} (grpo_deploy/profiles/)")
    return min(found, key=lambda p: p.hardware.get("gpus_per_host") != 1).name


def _setting_values(profile: profiles.Profile, section: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: s.value for k, s in profile.settings.get(section, {}).items() if k not in skip}


def trial_spec(trial: Trial, profile: str, mount: Path, model_dir: Path,
               vllm_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """The deployment spec of *trial* on one local host that runs both roles on GPU 0 (or the CPU); *vllm_args* go to
    the spec's overrides.vllm.extra_args (the spec's door checks them)."""
    gpu = profile != "cpu"
    overrides: dict[str, dict[str, Any]] = {"model": {"path": str(model_dir)}, "trl": {"max_steps": trial.steps}}
    if trial.shape == "rehearsal" and gpu:  # the cpu profile's task, on this GPU's profile
        cpu = profiles.load("cpu")
        overrides["model"] |= _setting_values(cpu, "model", ("path",))
        for section in ("lora", "data"):
            overrides[section] = _setting_values(cpu, section)
        overrides["trl"] = _setting_values(cpu, "trl") | overrides["trl"]
    if trial.shape == "seed004":
        per_row = max(1, 16384 // (trial.answer_tokens + 64))  # answers a 16,384-token row holds (prompt ~30-60)
        overrides["data"] = {"dataset": "brevity", "rewards": ["brevity"], "num_prompts": 64}
        overrides["trl"] |= {"max_completion_length": trial.answer_tokens,
                             "gradient_accumulation_steps": -(-RECIPE_ANSWERS // per_row)}
        overrides["vllm"] = {"max_model_len": 1024 + 3000}  # one server for every answer length
    if vllm_args:
        overrides.setdefault("vllm", {})["extra_args"] = list(vllm_args)
    if gpu and profiles.load(profile).hardware.get("gpus_per_host", 1) > 1:  # e.g. h200 on one H200
        share = profiles.load(ONE_GPU_PROFILE).value("vllm", "gpu_memory_utilization")
        overrides.setdefault("vllm", {})["gpu_memory_utilization"] = share
    if not trial.switches:
        overrides["runtime"] = dict(SWITCHES_OFF)
        if gpu and profiles.load(profile).hardware.get("memory_gb_per_gpu", 0) <= 80:
            overrides.setdefault("vllm", {})["gpu_memory_utilization"] = SWITCHES_OFF_VLLM_MEMORY
    host: dict[str, Any] = {"name": "gpu0" if gpu else "cpu0", "address": "local", "profile": profile,
                            "roles": ["server", "trainer"]}
    if gpu:
        host["gpus"] = {"server": [0], "trainer": [0]}
    return {"version": 1, "engine": TRL_ASYNC.name, "run": {"name": trial.name},
            "hosts": [host], "storage": {"mount": str(mount)},
            "checkpoints": {"save_every": trial.steps, "keep": 1},
            "overrides": {k: v for k, v in overrides.items() if v}}


@dataclass
class Rendered:
    """A trial's render, read back: the server's arguments and environment, the trainer's config and environment."""

    folder: Path
    server_args: str
    server_env: dict[str, str]
    trainer_env: dict[str, str]
    trainer_config: dict[str, Any]
    served_model: str
    port: int

    @property
    def server_key(self) -> tuple:
        """What the server runs: its arguments and environment, less comments and the run's name (a server kept for
        the next trial must be started the same way)."""
        args = [line for line in self.server_args.splitlines() if line.strip() and not line.startswith("#")]
        return tuple(args), tuple(sorted((k, v) for k, v in self.server_env.items() if k != "GRPO_RUN"))


def render_trial(trial: Trial, profile: str, work: Path, model_dir: Path, vllm_args: tuple[str, ...] = ()) -> Rendered:
    """Write the spec, render it with the kit (the same builders `grpo-deploy render` uses) and read the files back."""
    folder = work / trial.name
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "grpo-deploy.yaml"
    spec_path.write_text(yaml.safe_dump(trial_spec(trial, profile, work / "shared", model_dir, vllm_args),
                                       sort_keys=False))
    res = resolve(load(str(spec_path)))
    render = folder / "render"
    write_tree(render_files(res, config_dir=str(render / "config")), render, adopt=True)
    config = yaml.safe_load((render / "config/trainer.yaml").read_text())
    return Rendered(render, (render / "config/server.args").read_text(),
                    parse_env((render / "config/server.env").read_text()),
                    parse_env((render / "config/trainer.env").read_text()), config,
                    res.settings.model.served_name, res.settings.vllm.port)


def local_trainer_config(rendered: Rendered) -> Path:
    """The trainer's config with the server on loopback (compose's `server` name needs Docker's network)."""
    config = dict(rendered.trainer_config)
    config["async_grpo"] = {**config["async_grpo"], "vllm_server_base_url": f"http://{LOCAL}:{rendered.port}"}
    path = rendered.folder / "trainer.local.yaml"
    path.write_text("# The rendered config/trainer.yaml with the server on loopback (grpo_deploy.harness).\n"
                    + yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class Role:
    """A role's process (its own session, so its children go with it), its log and its peak GPU memory."""

    name: str
    process: subprocess.Popen
    log: Path
    peak_mib: int = 0
    started: float = field(default_factory=time.time)

    def stop(self, grace: float = 30.0) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def start_role(name: str, argv: list[str], env: dict[str, str], log: Path) -> Role:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    return Role(name, process, log)


def log_tail(path: Path, lines: int = 25) -> str:
    with open(path, "rb") as handle:
        handle.seek(max(0, os.path.getsize(path) - 16384))
        return "\n".join(handle.read().decode("utf-8", "replace").splitlines()[-lines:])


def wait_ready(server: Role, rendered: Rendered, timeout: float, say) -> float:
    """Seconds until the server lists the model and generates one token; raises when it dies or times out."""
    deadline, last = time.time() + timeout, 0.0
    while time.time() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited ({server.process.returncode}):\n{log_tail(server.log)}")
        ok, _ = health.server_healthy(rendered.port, rendered.served_model)
        if ok and health.first_token(rendered.port, rendered.served_model)[0]:
            return time.time() - server.started
        if time.time() - last > 30:
            say(f"  waiting for the server ({time.time() - server.started:.0f} s)")
            last = time.time()
        time.sleep(POLL_S)
    raise RuntimeError(f"the server was not ready in {timeout:.0f} s:\n{log_tail(server.log)}")


def run_trainer(rendered: Rendered, watch: MemoryWatch, timeout: float, say) -> Role:
    config = local_trainer_config(rendered)
    metrics = Path(rendered.trainer_config["metrics_path"])
    trainer = start_role("trainer", [sys.executable, "-m", "grpo_deploy.runtime.trainer.train", "--config",
                                     str(config)],
                         rendered.trainer_env, rendered.folder / "trainer.log")
    watch.roles.append(trainer)
    deadline, last = time.time() + timeout, time.time()
    while trainer.process.poll() is None and time.time() < deadline:
        time.sleep(POLL_S)
        if time.time() - last > 30:
            steps = sum(1 for e in _events(metrics) if e.get("event") == "step")
            say(f"  trainer: {steps} steps ({time.time() - trainer.started:.0f} s)")
            last = time.time()
    trainer.stop()
    return trainer


def _events(path: Path) -> list[dict]:
    return read_events(str(path)) if path.is_file() else []


def report(trial: Trial, rendered: Rendered, server: Role, trainer: Role, ready_s: float | None) -> dict[str, Any]:
    """What the harness measured: the figures `status` and `diagnose` compute from the trainer's own metrics, and the
    memory and times only the harness sees."""
    events = _events(Path(rendered.trainer_config["metrics_path"]))
    summary = status.summarize(trial.name, events).to_dict()
    evidence = diagnose(events).evidence
    steps = step_events(events)
    medians = {name: _median([float(s[key]) for s in steps if isinstance(s.get(key), int | float)])
               for name, key in MEDIANS.items()}
    # a short GPU trial trains from the rollouts queued while it started: the step generation sustains is the figure
    step_s = evidence.get("sustained_step_s") or medians["step_s_median"]
    return {
        "trial": trial.name, "shape": trial.shape, "steps_asked": trial.steps, "answer_tokens": trial.answer_tokens,
        "speed_switches": trial.switches, "trainer_exit": trainer.process.returncode,
        **{name: summary.get(key) for name, key in SUMMARY.items()},
        **medians,
        **{key: evidence.get(key) for key in ("generated_tok_s", "trained_tok_s", "mfu_fwd_bwd", "generation_floor_s",
                                              "fed_by_startup_backlog", "sustained_step_s")},
        "gpu_hours_per_500_steps": round(step_s * 500 / 3600, 3) if step_s and server.peak_mib else None,
        "server_peak_gib": round(server.peak_mib / 1024, 2), "trainer_peak_gib": round(trainer.peak_mib / 1024, 2),
        "server_ready_s": round(ready_s, 1) if ready_s is not None else None,
        "trainer_wall_s": round(time.time() - trainer.started, 1),
        "logs": {"server": str(server.log), "trainer": str(trainer.log)},
    }


# report key -> status.Summary field; report key -> TRL metric whose median over the steps is reported
SUMMARY = {"steps": "steps", "reward_first5": "reward_first5", "reward_last5": "reward_last5",
           "adapter_loads_ok": "adapter_loads_ok", "adapter_loads_failed": "adapter_loads_failed",
           "handoff_median_s": "median_handoff_s", "ratio_min": "importance_ratio_min",
           "ratio_max": "importance_ratio_max"}
MEDIANS = {"step_s_median": "perf/step_s", "fwd_bwd_s_median": "perf/fwd_bwd_s",
           "optimizer_s_median": "perf/optimizer_s", "rollout_wait_s_median": "perf/rollout_wait_s",
           "weight_sync_s_median": "perf/weight_sync_s", "samples_per_step": "batch/samples_per_step",
           "answer_length_median": "completions/mean_length"}


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return round(ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2, 4)


REPORT_LINE = ("{trial}: {steps}/{steps_asked} steps, reward {reward_first5} -> {reward_last5}, adapter loads "
               "{adapter_loads_ok} ok / {adapter_loads_failed} failed (hand-off {handoff_median_s} s), ratio "
               "{ratio_min}-{ratio_max}, step {step_s_median} s (fwd/bwd {fwd_bwd_s_median}, "
               "wait {rollout_wait_s_median}, sync {weight_sync_s_median}), {samples_per_step} answers/step of "
               "{answer_length_median} tokens, generated {generated_tok_s} tok/s, trained {trained_tok_s} tok/s, "
               "MFU {mfu_fwd_bwd}, sustained step {sustained_step_s} s (generation alone {generation_floor_s} s; "
               "fed by the start-up queue: {fed_by_startup_backlog}), {gpu_hours_per_500_steps} GPU-h/500 steps at "
               "the sustained step, peak GiB server {server_peak_gib} trainer {trainer_peak_gib}")


def model_kind(shape: str) -> str:
    return "tiny" if shape == "rehearsal" else "qwen2.5-1.5b"


def build_model(kind: str, out: Path, say) -> None:
    """The trial's random-weight model, built once per kind by the kit's own builder (as the cpu image bakes it)."""
    if not (out / "config.json").is_file():
        say(f"building the {kind} model (random weights) in {out}")
        subprocess.run([sys.executable, "-m", "grpo_deploy.runtime.tiny_model", "--shape", kind, "--out", str(out)],
                       check=True, stdout=subprocess.DEVNULL)


def run(trials: list[Trial], out: Path, ready_timeout: float, trial_timeout: float, vllm_args: tuple[str, ...] = (),
        say=print) -> list[dict]:
    """Each trial in order; a server is kept for the next trial when its rendered arguments are the same."""
    import torch

    gpu_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    profile = device_profile(gpu_name)
    say(f"harness: {gpu_name or 'CPU'} -> profile {profile}; {len(trials)} trial(s); output in {out}")
    work = out / "work"
    reports: list[dict] = []
    server: Role | None = None
    serving: tuple | None = None
    ready_s: float | None = None
    watch = MemoryWatch([])  # the roles running now
    watch.start()
    try:
        for trial in trials:
            model_dir = work / "models" / model_kind(trial.shape)
            rendered = render_trial(trial, profile, work, model_dir, vllm_args)  # the spec's door first
            build_model(model_kind(trial.shape), model_dir, say)
            if server is not None and serving != rendered.server_key:
                server.stop()
                watch.roles.remove(server)
                server = None
            if server is None:
                say(f"starting the vLLM server for {trial.name}")
                server = start_role("server", [sys.executable, "-m", "grpo_deploy.runtime.serving.serve", "--args-file",
                                               str(rendered.folder / "config/server.args")],
                                    rendered.server_env, rendered.folder / "server.log")
                watch.roles.append(server)
                ready_s, serving = wait_ready(server, rendered, ready_timeout, say), rendered.server_key
                say(f"  server ready in {ready_s:.0f} s")
            say(f"training {trial.name} ({trial.steps} steps)")
            trainer = run_trainer(rendered, watch, trial_timeout, say)
            watch.roles.remove(trainer)
            reports.append(report(trial, rendered, server, trainer, ready_s))
            ready_s = None  # a server kept for the next trial was ready before it
            say(REPORT_LINE.format(**reports[-1]))
            (out / "report.json").write_text(json.dumps({"gpu": gpu_name, "profile": profile,
                                                         "commit": os.environ.get("GRPO_COMMIT"),
                                                         "trials": reports}, indent=2) + "\n")
    finally:
        watch.done.set()
        if server is not None:
            server.stop()
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trial", action="append", type=parse_trial, required=True,
                        help="SHAPE:STEPS[:ANSWER_TOKENS[:on|off]] (repeatable), e.g. rehearsal:40, seed004:20:1300:on")
    parser.add_argument("--out", required=True, type=Path, help="folder for the work tree, logs and report.json")
    parser.add_argument("--ready-timeout", type=seconds, default=900.0, help="seconds the server may take (900)")
    parser.add_argument("--trial-timeout", type=seconds, default=1800.0,
                        help="seconds a trial's trainer may run before it is stopped and reported as it stands (1800)")
    parser.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                        help="an extra vLLM argument (repeatable; the spec's overrides.vllm.extra_args), e.g. "
                             "--vllm-arg=--enforce-eager")
    args = parser.parse_args(argv)
    try:
        reports = run(args.trial, args.out.resolve(), args.ready_timeout, args.trial_timeout, tuple(args.vllm_arg))
    except (SpecError, RenderError) as exc:  # e.g. a --vllm-arg the spec's door refuses
        print(f"harness: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # --out where nothing can be written (a file, a read-only folder)
        print(f"harness: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"harness: {exc}", file=sys.stderr)
        return 1
    return 0 if all(r["trainer_exit"] == 0 and r["steps"] == r["steps_asked"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
