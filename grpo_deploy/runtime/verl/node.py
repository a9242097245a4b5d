"""The verl container's entrypoint: `python3 -m grpo_deploy.runtime.verl.node --role head` starts the Ray head with
the node's resources, runs verl's trainer (`python3 -m verl.trainer.main_ppo` with the rendered overrides) as a driver
that joins it, and turns verl's own per-step metrics into the kit's events (metrics.jsonl on the share: status, the
plot, the summary and `up`'s progress lines read them). The exit code is the driver's.

verl's file logger truncates its file when it opens it, so every attempt (a first start, each resume) gets a file of
its own under <run dir>/verl-metrics/; the kit's metrics.jsonl appends across attempts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pydantic import Field, ValidationError

from grpo_deploy.common.metrics import MetricsSink
from grpo_deploy.common.strict import Strict
from grpo_deploy.runtime.identity import apply_umask, identity
from grpo_deploy.runtime.storage.disk_space import DiskWatchdogConfig, free_bytes, judge
from grpo_deploy.runtime.verl import failpoint, ray_cluster, ray_node
from grpo_deploy.runtime.verl.rollout_check import KEYS as ROLLOUT_GAP_KEYS
from grpo_deploy.runtime.verl.rollout_check import RolloutGapRule
from grpo_deploy.runtime.watch.config import WatchConfig
from grpo_deploy.runtime.watch.run_watch import STOPPED_EARLY, RunWatch, read_history
from grpo_deploy.runtime.watch.watcher import stale_policy_message

STEP_KEYS = {
    "critic/score/mean": "reward",
    "response_length/mean": "completions/mean_length",
}
"""verl's metric -> the kit's name for it (what status, the plot and diagnose read for every engine)."""
TELEMETRY = ("actor/kl_loss", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/lr", "critic/score/max",
             "critic/score/min", "response_length/clip_ratio", "timing_s/step", "timing_s/gen",
             "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/reward",
             "timing_s/save_checkpoint", "timing_s/testing", "perf/throughput", "perf/cpu_memory_used_gb",
             *ROLLOUT_GAP_KEYS)
"""verl's metrics kept verbatim in each step event (the seed-000 telemetry: reward, KL, gradient norm, response
length, time per phase); validation scores (val-core/..., val-aux/...) are kept whenever verl validates."""
POLL_S = 1.0
CONFIG_MAX_BYTES = 64 * 1024


class VerlNodeConfig(Strict):
    """config/verl-node.json: what the head does around verl for this run (rendered by the verl engine)."""

    run_dir: str
    """The run's folder on the share (metrics.jsonl, verl-metrics/)."""
    dataset: str
    """The task: brevity is generated here; others are written from data_source."""
    data_dir: str
    """Where train.parquet and test.parquet are (or are written)."""
    data_source: str = ""
    """A JSONL file the parquet files are written from ("" : none)."""
    num_prompts: int = Field(0, ge=0)
    checkpoint_dir: str
    """verl's trainer.default_local_dir."""
    keep: int = Field(0, ge=0)
    """Complete checkpoints kept over every attempt (0: all)."""
    save_every: int = Field(0, ge=0)
    """verl's trainer.save_freq (0: never)."""
    total_steps: int = Field(..., ge=1)
    watchdog: DiskWatchdogConfig | None = None
    """The disk watchdog before each save (None: off)."""
    watch: WatchConfig | None = None
    """The run watcher on each verl step (None: off): a plateau's stop takes effect after the next save."""
    nnodes: int = Field(1, ge=1)
    """Ray nodes the spec asks for (the head and every worker host)."""
    gpus_per_node: int = Field(1, ge=1)
    """verl's trainer.n_gpus_per_node."""
    join_timeout_s: float = Field(300, gt=0, le=3600)
    """How long the head waits for every worker to join before it refuses to start verl."""


def load_node_config(path: Path) -> VerlNodeConfig:
    """The node config, read bounded and without following a link; SystemExit with one line when it is not valid."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
        if len(raw) > CONFIG_MAX_BYTES:
            raise ValueError(f"larger than {CONFIG_MAX_BYTES} bytes")
        return VerlNodeConfig.model_validate(json.loads(raw))
    except (OSError, ValueError, ValidationError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise SystemExit(f"verl node: {path}: {detail} (render it again with grpo-deploy render / up)") from None
RAY_START_TIMEOUT_S = 180


def step_event(record: dict) -> dict | None:
    """The kit's step event for one line of verl's file logger (`{"step": N, "data": {...}}`), None for another
    line."""
    step, data = record.get("step"), record.get("data")
    if not isinstance(step, int) or not isinstance(data, dict):
        return None
    event = {"step": step}
    for theirs, ours in STEP_KEYS.items():
        if isinstance(data.get(theirs), (int, float)):
            event[ours] = data[theirs]
    for key, value in data.items():
        if (key in TELEMETRY or key.startswith(("val-core/", "val-aux/"))) and isinstance(value, (int, float)):
            event[key] = value
    return event


class Retention:
    """The kit's checkpoint rules over every global_step_N on the share, whichever attempt wrote it (verl's own
    max_actor_ckpt_to_keep only knows the saves of its own process: after a resume the older ones stayed). Before an
    attempt: a save cut short is quarantined (never deleted) and the tracker's step must be complete; after each
    new complete save (the tracker moved) and at the end: the newest *keep* complete ones stay (0: all)."""

    def __init__(self, directory: Path, keep: int, sink: MetricsSink):
        self.directory, self.keep, self.sink, self.seen = str(directory), keep, sink, None

    def before_attempt(self) -> str | None:
        """The step this attempt resumes from (None: from scratch); SystemExit with one line when it cannot."""
        from grpo_deploy.runtime.storage import checkpoints, resume

        try:
            path, moved = resume.verl_resume(self.directory)
        except (resume.ResumeError, checkpoints.TrackerUnreadable) as exc:
            raise SystemExit(f"verl node: {exc}") from None
        for item in moved:
            self.sink.emit("checkpoint_quarantine", path=item.path, moved_to=item.moved_to, reason=item.reason)
        self.seen = checkpoints.verl_tracker(self.directory)
        self.prune(leave_partial=False)
        return path

    def after_step(self, _step: int = 0) -> None:
        from grpo_deploy.runtime.storage import checkpoints

        tracker = checkpoints.verl_tracker(self.directory)
        if tracker is not None and tracker != self.seen:
            self.seen = tracker
            self.prune(leave_partial=True)  # verl may be writing the next save: leave a partial one where it is

    def prune(self, leave_partial: bool) -> None:
        from grpo_deploy.runtime.storage import checkpoints

        if not self.keep or not os.path.isdir(self.directory):
            return
        try:
            result = checkpoints.prune(self.directory, self.keep, "verl", leave_partial=leave_partial)
        except (checkpoints.TrackerUnreadable, OSError) as exc:
            print(f"verl node: retention skipped: {exc}", file=sys.stderr, flush=True)
            return
        if result.removed or result.quarantined:
            self.sink.emit("checkpoint_prune", removed=[c.path for c in result.removed],
                           quarantined=[q.path for q in result.quarantined], kept=[c.step for c in result.kept])


class SaveWatchdog:
    """The disk watchdog for verl's saves, judged as each step's metrics arrive: when the next step saves (verl saves
    inside the step, before its metrics) and the checkpoint plus the margin does not fit where checkpoints go, the
    trainer is stopped before that step's save can start — the newest complete checkpoint kept, nothing half-written
    (the seed's step-80 crash). *stop*(verdict) ends the driver."""

    def __init__(self, config: VerlNodeConfig, sink: MetricsSink, stop, free=None):
        self.config, self.sink, self.stop, self.free, self.tripped = config, sink, stop, free, None

    def saves_at(self, step: int) -> bool:
        every, total = self.config.save_every, self.config.total_steps
        return bool(every) and (step % every == 0 or step == total)

    def after_step(self, step: int) -> None:
        if self.config.watchdog is None or self.tripped is not None or not self.saves_at(step + 1):
            return
        verdict = judge(self.config.checkpoint_dir, self.config.watchdog, self.free or free_bytes, layout="verl")
        if not verdict.fits:
            self.tripped = verdict
            self.sink.emit("disk_watchdog_stop", step=step, free_bytes=verdict.free_bytes,
                           need_bytes=verdict.need_bytes, message=verdict.message)
            print(verdict.message, file=sys.stderr, flush=True)
            self.stop()


class WatchStop:
    """The run watcher on verl's steps (run_watch.RunWatch; None: off). Once it asks for a stop, the driver is ended
    after the next step that saved — verl saves inside the step, before that step's metrics arrive — so the newest
    complete checkpoint is the stop's own; a run that never saves is ended at once. *stop*() ends the driver.
    Each step is also judged by verl's side of the served-policy check (rollout_check.RolloutGapRule): a
    `served_policy` event per step, a finding of it handed to the watcher as the trl-async probe's are (with the
    watcher off, as trl-async's: the events, and one line in the node's log instead of a finding, no stop)."""

    def __init__(self, watch, save_every: int, saves_at, stop, emit=None):
        self.watch, self.save_every, self.saves_at, self.stop = watch, save_every, saves_at, stop
        self.emit, self.gap = emit, RolloutGapRule()
        self.stopped_at: int | None = None

    def after_step(self, event: dict) -> None:
        if self.stopped_at is not None:
            return
        step = int(event["step"])
        self.check_rollout(step, event)
        if self.watch is None:
            return
        if self.watch.step(step, event) is not None and (not self.save_every or self.saves_at(step)):
            self.stopped_at = step
            print(f"verl node: run watcher: {self.watch.stop.message}: stopping verl after step {step}",
                  file=sys.stderr, flush=True)
            self.stop()

    def check_rollout(self, step: int, event: dict) -> None:
        verdict = self.gap.judge(step, event)
        if verdict.verdict == "unknown":
            return  # no gap logged (rollout.calculate_log_probs off, or verl's own 'invalid'): nothing judged
        if self.emit is not None:
            self.emit("served_policy", check="rollout-gap", step=step, verdict=verdict.verdict, gap_mean=verdict.mean,
                      gap_max=verdict.peak, floor=self.gap.floor, threshold=verdict.threshold, streak=verdict.streak)
        report = verdict.finding if verdict.finding is not None else (
            {"verdict": "rollout-gap", "clear": True} if verdict.clear else None)
        if report is None:
            return
        if self.watch is not None:
            self.watch.report(report)
        elif verdict.finding is not None:
            print(f"verl node: {stale_policy_message(verdict.finding)} (the run watcher is off: nothing is stopped)",
                  file=sys.stderr, flush=True)


class StepFollower(threading.Thread):
    """Tails verl's metrics file and emits one kit `step` event per verl step (a torn last line waits for its end)."""

    def __init__(self, path: Path, sink: MetricsSink, on_step=None):
        super().__init__(daemon=True)
        self.path, self.sink, self.steps, self.last_step = path, sink, 0, 0
        self.on_step = on_step
        self._done = threading.Event()

    def run(self) -> None:
        offset, pending = 0, b""
        while True:
            stopping = self._done.is_set()
            try:
                with open(self.path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read(1 << 20)
            except FileNotFoundError:
                chunk = b""
            offset += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                self._line(line)
            if stopping and not chunk:
                return
            if not chunk:
                self._done.wait(POLL_S)

    def _line(self, line: bytes) -> None:
        try:
            event = step_event(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return
        if event is not None:
            self.sink.emit("step", **event)
            self.steps, self.last_step = self.steps + 1, event["step"]
            if self.on_step is not None:
                self.on_step(event)

    def finish(self) -> None:
        self._done.set()
        self.join(timeout=10)


def read_overrides(path: Path) -> list[str]:
    """The rendered Hydra overrides, one per line (comments and blank lines skipped)."""
    text = path.read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def prepare_data(dataset: str, data_dir: Path, num_prompts: int, source: str = "") -> str:
    """The run's parquet files: kept when train.parquet is there; else written from *source* (the spec's JSONL,
    e.g. GSM8K's train split) or, for the synthetic brevity task, generated; a bad row is refused with its number
    (SystemExit, one line: nothing is written then)."""
    from grpo_deploy.runtime.verl import data as verl_data

    if (data_dir / verl_data.FILES[0]).is_file():
        return f"{data_dir}: kept"
    if dataset != "brevity" and not source:
        raise SystemExit(f"verl node: {data_dir / verl_data.FILES[0]} is missing and no dataset.path names a JSONL "
                         f"file to write it from: put the {dataset} rows on the share and set dataset.path")
    argv = ["--dataset", dataset, "--out", str(data_dir)] + (["--path", source] if source else []) + \
        (["--num-prompts", str(num_prompts)] if num_prompts else [])
    if verl_data.main(argv) != 0:
        raise SystemExit(f"verl node: writing the {dataset} data to {data_dir} failed (the line above says why)")
    return f"{data_dir}: written" + (f" from {source}" if source else "")


DISK_FULL = 3
"""The head's exit code when the disk watchdog stopped the run before a save."""
CLUSTER_SHORT = 4
"""The head's exit code when the Ray cluster is not what the spec asks for (verl never started)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m grpo_deploy.runtime.verl.node", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=("head", "worker"), default="head", help="the Ray role of this node")
    parser.add_argument("--config", type=Path, default=Path("/etc/grpo-deploy/verl-node.json"),
                        help="what the head does around verl (rendered)")
    parser.add_argument("--overrides", type=Path, default=Path("/etc/grpo-deploy/verl-overrides.txt"),
                        help="verl's Hydra overrides (rendered), one per line")
    parser.add_argument("--num-cpus", type=int, default=0, help="Ray CPUs of this node (0: Ray counts them)")
    parser.add_argument("--num-gpus", type=int, default=0, help="Ray GPUs of this node (logical on CPU; 0: counted)")
    parser.add_argument("--object-store-bytes", type=int, default=0, help="Ray's object store (0: Ray's default)")
    parser.add_argument("--head-address", default="", help="the head's GCS, ip:port (a worker joins it)")
    parser.add_argument("--node-ip", default="", help="this node's address (empty: one host, Ray's choice)")
    parser.add_argument("--ifname", default="", help="NCCL/Gloo interface (empty: the one holding --node-ip)")
    parser.add_argument("--cluster", default="0", choices=("0", "1"),
                        help="1: one node of several hosts (fixed Ray ports, the cluster check)")
    return parser.parse_args(argv)


def node_args(args: argparse.Namespace) -> ray_node.NodeArgs:
    return ray_node.NodeArgs(args.role, args.head_address, args.node_ip, args.ifname, args.num_cpus, args.num_gpus,
                             args.object_store_bytes, args.cluster == "1")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apply_umask()
    config = load_node_config(args.config)
    node = node_args(args)
    token = Path(config.run_dir) / ray_node.TOKEN_NAME
    return worker(node, token) if node.role == "worker" else head(config, node, token, args.overrides)


def worker(node: ray_node.NodeArgs, token: Path) -> int:
    """A worker: Ray joins the head and stays in the foreground until its raylet ends (the head gone, or stopped)."""
    try:
        env = {**os.environ, **ray_node.socket_env(node), **ray_node.ray_env(ray_node.ensure_token(token, False),
                                                                                node.head)}
    except SystemExit as exc:
        print(exc, file=sys.stderr, flush=True)
        return 2
    print(f"verl node: joining the Ray head at {node.head} as {node.node_ip or 'this host'} "
          f"({env.get('GLOO_SOCKET_IFNAME', 'loopback')})", flush=True)
    ray = shutil.which("ray") or "ray"
    argv = ray_node.start_argv(node)
    os.execvpe(ray, [ray, *argv[1:]], env)  # the container's process is Ray's: docker stop reaches it
    return 0  # not reached


def check_cluster(config: VerlNodeConfig, node: ray_node.NodeArgs, sink: MetricsSink) -> ray_cluster.Verdict:
    """Wait for every worker to join, then the counts against the spec (events for `up`'s progress lines)."""
    want = ray_cluster.ClusterWant(config.nnodes, config.gpus_per_node)
    read, close = ray_cluster.ray_reader(f"127.0.0.1:{ray_node.GCS_PORT}" if not node.node_ip
                                         else f"{node.node_ip}:{ray_node.GCS_PORT}")
    try:
        verdict = ray_cluster.wait_for(
            read, want, config.join_timeout_s,
            on_change=lambda nodes: sink.emit("ray_nodes", nodes=len(nodes), want=config.nnodes,
                                              node_ips=[n.ip for n in nodes]))
    finally:
        close()
    sink.emit("ray_cluster", ok=verdict.ok, message=verdict.message, **verdict.counts())
    return verdict


def head(config: VerlNodeConfig, node: ray_node.NodeArgs, token: Path, overrides_path: Path) -> int:
    run_dir = Path(config.run_dir)
    attempt = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    verl_metrics = run_dir / "verl-metrics" / f"attempt-{attempt}.jsonl"
    verl_metrics.parent.mkdir(parents=True, exist_ok=True)
    sink = MetricsSink(str(run_dir / "metrics.jsonl"))
    retention = Retention(Path(config.checkpoint_dir), config.keep, sink)
    try:
        overrides = read_overrides(overrides_path)
        data = prepare_data(config.dataset, Path(config.data_dir), config.num_prompts, config.data_source)
        print(f"verl node: data {data}", flush=True)
        resumed_from = retention.before_attempt()
        address = f"{node.node_ip or '127.0.0.1'}:{ray_node.GCS_PORT}"
        env = {**os.environ, **ray_node.socket_env(node), "VERL_FILE_LOGGER_PATH": str(verl_metrics),
               failpoint.ENV: failpoint.folder(config.checkpoint_dir),
               **ray_node.ray_env(ray_node.ensure_token(token, True), address)}
    except (SystemExit, OSError) as exc:  # one line in the log and a run_end for status: nothing was started
        print(exc, file=sys.stderr, flush=True)
        sink.emit("run_end", status="failed", error=str(exc)[:500], steps=0)
        return 2
    sink.emit("run_start", engine="verl", **identity(), pid=os.getpid(), verl_metrics=str(verl_metrics),
              resumed_from=resumed_from, objective=config.watch.objective if config.watch else None)
    if config.watchdog is not None:
        sink.emit("disk_watchdog_armed", checkpoint_bytes=config.watchdog.checkpoint_bytes,
                  margin_bytes=config.watchdog.margin_bytes)
    ray = shutil.which("ray") or "ray"
    started = subprocess.run([ray, *ray_node.start_argv(node)[1:]], env=env, timeout=RAY_START_TIMEOUT_S,
                             stdout=sys.stdout, stderr=subprocess.STDOUT)
    if started.returncode != 0:
        sink.emit("run_end", status="failed", error=f"ray start exited {started.returncode}", steps=0)
        return started.returncode
    sink.emit("trainer_ready", ray="head", address=address)
    if node.cluster:
        os.environ.update({k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")})
        verdict = check_cluster(config, node, sink)
        print(f"verl node: {verdict.message}", file=sys.stderr if not verdict.ok else sys.stdout, flush=True)
        if not verdict.ok:
            stop_ray(ray, env)
            sink.emit("run_end", status="cluster-short", error=verdict.message, steps=0)
            sink.close()
            return CLUSTER_SHORT
    return drive(config, sink, retention, env, ray, overrides, verl_metrics, attempt)


def stop_ray(ray: str, env: dict) -> None:
    subprocess.run([ray, "stop", "--force"], env=env, timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def drive(config: VerlNodeConfig, sink: MetricsSink, retention: Retention, env: dict, ray: str,
          overrides: list[str], verl_metrics: Path, attempt: str) -> int:
    """verl's trainer as a driver joining the running cluster (never a local Ray of its own: RAY_ADDRESS), followed
    to its end; the kit's retention and disk watchdog on each step."""
    # Hydra's own output folder (the composed config, its log) beside the attempt's metrics, not in the cwd
    hydra_dir = f"hydra.run.dir={verl_metrics.parent / ('hydra-' + attempt)}"
    # verl's TaskRunner (whose file logger writes the metrics) is a Ray actor that may land on any node: the path
    # reaches it through the job's runtime env, not this process's environment (seen: TaskRunner on the worker host,
    # its metrics in the worker container's cwd, no step for `up`)
    logger_path = f"++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={verl_metrics}"
    failpoints = f"++ray_kwargs.ray_init.runtime_env.env_vars.{failpoint.ENV}={env[failpoint.ENV]}"  # head's env
    driver = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *overrides, hydra_dir, logger_path,
                               failpoints], env=env)
    watchdog = SaveWatchdog(config, sink, lambda: driver.send_signal(signal.SIGTERM))
    watched = WatchStop(RunWatch(config.watch, sink.emit, read_history(sink.path)) if config.watch else None,
                        config.save_every, watchdog.saves_at, lambda: driver.send_signal(signal.SIGTERM), sink.emit)

    def on_step(event: dict) -> None:
        step = int(event["step"])
        retention.after_step(step)
        watchdog.after_step(step)
        watched.after_step(event)

    follower = StepFollower(verl_metrics, sink, on_step)
    follower.start()

    def forward(signum, _frame):
        driver.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = driver.wait()
    follower.finish()
    retention.prune(leave_partial=False)
    if watched.watch is not None:
        watched.watch.summary()
    if watchdog.tripped is not None:
        sink.emit("run_end", status="disk-full", error=watchdog.tripped.message, steps=follower.last_step)
        code = DISK_FULL
    elif watched.stopped_at is not None:
        sink.emit("run_end", status=STOPPED_EARLY, steps=follower.last_step,
                  error=f"run watcher: {watched.watch.stop.message} (stopped after step {watched.stopped_at})")
        code = 0
    else:
        sink.emit("run_end", status="ok" if code == 0 else "failed", steps=follower.last_step,
                  error=None if code == 0 else f"verl's trainer exited {code}")
    sink.close()
    stop_ray(ray, env)  # after run_end: the workers leave with the head's Ray, which `up` must not take for a fault
    return code


if __name__ == "__main__":
    sys.exit(main())
