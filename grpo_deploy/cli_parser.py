"""The command line's grammar: verbs, options and their help, and the value types that refuse bad input in one line
(argparse: exit 2). What each verb does is grpo_deploy.cli's."""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Callable, Mapping

from grpo_deploy import __version__, preflight
from grpo_deploy.engines import ENGINE_NAMES
from grpo_deploy.image_build.cli import add_images_parser
from grpo_deploy.names import UP_RESTARTS
from grpo_deploy.runtime.bench import trainer as bench_trainer
from grpo_deploy.spec import profiles

DEFAULT_SPEC = "grpo-deploy.yaml"
EXIT_USAGE = 2
MAX_SIZE = 1e21  # bytes: a zettabyte; --free-space beyond that is a typo


class _Help(argparse.HelpFormatter):
    """argparse's help, wrapped between words only: a hyphenated name (grpo-deploy/debian:bookworm, cuda-trainer-amd64,
    --free-space) is never split at a hyphen, so that a name copied from the help is the name."""

    def _split_lines(self, text, width):
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        return textwrap.fill(self._whitespace_matcher.sub(" ", text).strip(), width, initial_indent=indent,
                             subsequent_indent=indent, break_on_hyphens=False)


class _Paragraphs(_Help):
    """A description of several paragraphs (a module's docstring): each paragraph filled to the terminal's width, the
    blank lines between them kept (argparse's default joins them; RawDescription leaves lines wider than the
    terminal, which it then cuts mid-word)."""

    def _fill_text(self, text, width, indent):
        return "\n\n".join(super(_Paragraphs, self)._fill_text(part, width, indent)
                             for part in re.split(r"\n\s*\n", text.strip()))


class Parser(argparse.ArgumentParser):
    """argparse with the kit's error format (one line, exit 2: the usage is one `--help` away) and its help wrapped
    between words (_Help), for every verb (a verb's parser is a Parser too)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


class _Append(argparse.Action):
    """action="append" that refuses `--opt=--`: argparse strips a lone `--` from a value and appends an empty list,
    which would silently mean nothing (a check list that runs only the others)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if not isinstance(values, str):
            parser.error(f"argument {option_string}: expected a value, got '--'")
        items = list(getattr(namespace, self.dest, None) or [])
        setattr(namespace, self.dest, [*items, values])


class CliError(Exception):
    """An expected failure: printed as one clear message, exit code 2, no traceback."""


# ---------------------------------------------------------------- shared helpers

def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise CliError(f"--free-space: cannot read size {text!r} (use e.g. 500GB, 1.5TB, 800GiB)")
    unit = (m.group(2) or "B").upper().rstrip("B") or "B"
    factor = {"B": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}[unit]
    size = float(m.group(1)) * factor
    if not size < MAX_SIZE:
        raise CliError(f"--free-space: {text!r} is more than any filesystem holds (use e.g. 500GB, 1.5TB)")
    return int(size)


def _output_path(text: str) -> str:
    """-o as given: a usable path name (argparse turns a refusal into one line and exit 2)."""
    if not text or "\x00" in text or len(text) > 4096 or text.count("/") > 64 or \
            any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in text.split("/")):
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a usable path (empty, a NUL byte, a name over 255 "
                                         "bytes, or over 64 folders / 4096 characters)")
    return text


def _interval(text: str) -> float:
    """--watch SECONDS: a number from 1 to 3600."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds from 1 to 3600")
    return value


def _keep_count(text: str) -> int:
    """--keep N: a whole number from 1 to 10000 (the newest complete checkpoint is never removed)."""
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= 10_000:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a count from 1 to 10000")
    return int(text)


def _restart_count(text: str) -> int:
    """--restarts N: a whole number from 0 to 10."""
    if not re.fullmatch(r"[0-9]{1,2}", text) or int(text) > 10:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a count from 0 to 10")
    return int(text)


def _line_count(text: str) -> int:
    """--tail N: a whole number from 0 to 100000."""
    if not re.fullmatch(r"[0-9]{1,6}", text) or int(text) > 100_000:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a line count from 0 to 100000")
    return int(text)


def _budget_minutes(text: str) -> float:
    """--budget MINUTES: a number from 1 to 10080 (a week), plain digits (no exponent, no sign)."""
    value = float(text) if re.fullmatch(r"[0-9]{1,5}(\.[0-9]{1,3})?", text) else float("nan")
    if not 1 <= value <= 10_080:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of minutes from 1 to 10080")
    return value


def _reward_target(text: str) -> float:
    """--target REWARD: a mean reward the kit's tasks can reach, above 0 and at most 1."""
    value = float(text) if re.fullmatch(r"[0-9]?\.?[0-9]{1,6}", text) else float("nan")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a mean reward above 0 and at most 1 (the kit's "
                                         "rewards are 0..1 per answer)")
    return value


def _trial_steps(text: str) -> int:
    """--steps N: a trial's optimizer steps, 6 to 10000 (the reward's line needs a few)."""
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 6 <= int(text) <= 10_000:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a step count from 6 to 10000")
    return int(text)


def _knob_names(text: str) -> tuple[str, ...]:
    """--knobs a,b: names of the engine's knobs (checked against the spec's engine once it is loaded)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names or any(not re.fullmatch(r"[a-z][a-z0-9_-]{0,40}", n) for n in names):
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a comma-separated list of knob names "
                                         "(lower-case letters, digits, - and _)")
    return names


def host_list(text: str | None) -> list[str]:
    """--hosts a,b -> [a, b] (blanks dropped); none given -> []."""
    return [h.strip() for h in text.split(",") if h.strip()] if text else []


def _add_spec(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", metavar="SPEC",
                   help=f"deployment spec (default: ./{DEFAULT_SPEC}, else the embedded cpu rehearsal)")


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output (stable shape)")


def _add_ssh(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ssh-config", metavar="FILE", help="ssh config to read for host aliases, users, ports, keys, "
                                                        "ProxyJump and known_hosts (default ~/.ssh/config)")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="accept and save the key of a host not in known_hosts yet (a changed key is still refused)")


def _add_free_space(p: argparse.ArgumentParser) -> None:
    p.add_argument("--free-space", action=_Append, metavar="HOST=SIZE",
                   help="what-if: plan as if HOST had SIZE free where checkpoints go (e.g. node1=500GB); repeatable")


Verbs = Mapping[str, Callable[[argparse.Namespace], int]]
"""Each verb (k8s-render and k8s-check for `k8s`) -> its handler (grpo_deploy.cli.VERBS)."""


def build_parser(verbs: Verbs) -> argparse.ArgumentParser:
    """The whole command line; *verbs* maps each verb (k8s-render and k8s-check for `k8s`) to its handler."""
    parser = Parser(
        prog="grpo-deploy",
        description="Render, check and launch GRPO + LoRA post-training deployments "
                    "(TRL async GRPO + vLLM server, or verl) from one spec and hardware profiles.",
        epilog="Typical flow: init -> plan -> preflight -> up -> status. Every verb has --help.",
    )
    parser.add_argument("--version", action="version", version=f"grpo-deploy {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    _add_init(sub, verbs)
    _add_render(sub, verbs)
    _add_k8s(sub, verbs)
    _add_plan(sub, verbs)
    _add_preflight(sub, verbs)
    _add_profiles(sub, verbs)
    _add_up(sub, verbs)
    _add_status(sub, verbs)
    _add_down(sub, verbs)
    _add_logs(sub, verbs)
    _add_check(sub, verbs)
    _add_bench(sub)
    add_images_parser(sub)
    _add_checkpoints(sub, verbs)
    _add_diagnose(sub, verbs)
    _add_tune(sub, verbs)
    return parser


# ---------------------------------------------------------------- one grammar per verb, in --help's order

def _add_init(sub, verbs: Verbs) -> None:
    """`init`: a commented spec from a hardware profile."""
    p = sub.add_parser("init", help="write a commented deployment spec from a hardware profile",
                       description="Write a commented spec with every key, filled from a hardware profile.")
    p.add_argument("--profile", required=True, choices=profiles.names(), help="hardware profile (grpo-deploy profiles)")
    p.add_argument("--engine", required=True, choices=ENGINE_NAMES, help="training engine")
    p.add_argument("--hosts", help="comma-separated SSH hosts; trl-async: 'trainer,server' (e.g. spark1,spark2) or one "
                                   "host for both roles; verl: head first, then workers. Default: this machine")
    p.add_argument("--name", help="run name (default: from profile and engine)")
    p.add_argument("-o", "--output", default=DEFAULT_SPEC, type=_output_path,
                   help=f"file to write (default {DEFAULT_SPEC})")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(fn=verbs["init"])


def _add_render(sub, verbs: Verbs) -> None:
    """`render`: every artifact of the run into a folder, or --check it."""
    p = sub.add_parser("render", help="write every artifact (vLLM args, trainer config, compose env, verl overrides)",
                       description="Render every artifact of the run into DIR: a new or empty directory, or an "
                                   "earlier render, whose record (.grpo-deploy-render) lists the files the kit wrote: "
                                   "only those are replaced or removed, nothing else is touched. With --check, compare "
                                   "the directory with a fresh render and exit 1 on any "
                                   "difference.")
    _add_spec(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", type=_output_path, help="output directory")
    p.add_argument("--check", action="store_true", help="diff DIR against a fresh render instead of writing")
    p.set_defaults(fn=verbs["render"])


def _add_k8s(sub, verbs: Verbs) -> None:
    """`k8s render` and `k8s check`: a Kubernetes overlay's generated/ files."""
    p = sub.add_parser("k8s", help="a Kubernetes overlay (k8s/<name>/): render its generated/, check it before apply")
    k8s = p.add_subparsers(dest="k8s_verb", metavar="ACTION", required=True, parser_class=Parser)
    q = k8s.add_parser("render", help="rewrite OVERLAY/generated/ from OVERLAY/spec.yaml (only files the kit wrote)")
    q.add_argument("overlay", metavar="OVERLAY", help="an overlay folder, e.g. k8s/h200")
    q.set_defaults(fn=verbs["k8s-render"])
    q = k8s.add_parser("check", help="refuse an overlay that still holds a placeholder (NFS address, registry) or a "
                                     "stale generated/; exit 0 when it is ready for kubectl apply -k")
    q.add_argument("overlay", metavar="OVERLAY", help="an overlay folder, e.g. k8s/h200")
    q.set_defaults(fn=verbs["k8s-check"])


def _add_plan(sub, verbs: Verbs) -> None:
    """`plan`: what runs where, memory fit, checkpoint size and disk need."""
    p = sub.add_parser("plan", help="what runs where, memory fit, checkpoint size and disk need per host",
                       description="Plan the run: roles and GPUs per host, memory fit (rough estimates), checkpoint "
                                   "size, save schedule, and disk need against the real free space. Exit 1 when "
                                   "something does not fit.")
    _add_spec(p)
    _add_json(p)
    _add_free_space(p)
    p.add_argument("--explain", action="store_true", help="list every setting with its source and reason")
    p.set_defaults(fn=verbs["plan"])


def _add_preflight(sub, verbs: Verbs) -> None:
    """`preflight`: every precondition checked before anything starts."""
    p = sub.add_parser("preflight", help="run every check; table or --json; exit 0 ok, 1 failed, 2 could not run",
                       description="Check every precondition before anything starts: spec, identity (UID/umask), "
                                   "Docker engine, architecture, disk headroom, logger credentials, images.")
    _add_spec(p)
    _add_json(p)
    _add_free_space(p)
    p.add_argument("--only", action=_Append, metavar="CHECK", choices=preflight.names(),
                   help=f"run only this check (repeatable): {', '.join(preflight.names())}")
    _add_ssh(p)
    p.set_defaults(fn=verbs["preflight"])


def _add_profiles(sub, verbs: Verbs) -> None:
    """`profiles`: the hardware profiles."""
    p = sub.add_parser("profiles", help="list the hardware profiles")
    p.set_defaults(fn=verbs["profiles"])


def _add_up(sub, verbs: Verbs) -> None:
    """`up`: start the run on its hosts, follow it, summarise."""
    p = sub.add_parser("up", help="start the run on its hosts, follow it, summarise (all-or-nothing)",
                       description="Render, build missing images (refresh the cpu image's code layer), run preflight "
                                   "on every host (nothing starts if a check fails), ship images to remote hosts over "
                                   "SSH (only what they lack), start the vLLM server, wait until it lists the model "
                                   "and generates a token (checked from the trainer's host), start the trainer, print "
                                   "progress per step, then a summary; stop the run unless --keep. Without a spec: "
                                   "the embedded cpu rehearsal on this machine.")
    _add_spec(p)
    p.add_argument("--hosts", help="the spec's hosts, as a check (e.g. spark1,spark2): refused when they differ")
    _add_ssh(p)
    p.add_argument("--keep", action="store_true", help="leave the server and trainer containers up at the end")
    p.add_argument("--fresh", action="store_true", help="move this run's old folder on the shared volume aside first, "
                                                         "whole, as runs/NAME.before-UTCTIME (never deleted; default: "
                                                         "resume from the newest complete checkpoint, and refuse a "
                                                         "folder that holds another engine's, model's or LoRA shape's "
                                                         "run)")
    p.add_argument("--scratch", action="store_true", help=argparse.SUPPRESS)  # the tuner's trials: --fresh removes
    p.add_argument("--restarts", type=_restart_count, default=UP_RESTARTS, metavar="N",
                   help="when the vLLM server dies mid-run, restart the server and the trainer (which resumes from "
                        "its newest complete checkpoint); a dead vLLM replica or replica proxy alone, while the "
                        f"trainer goes on; up to N restarts in all (0-10, default {UP_RESTARTS})")
    p.set_defaults(fn=verbs["up"])


def _add_status(sub, verbs: Verbs) -> None:
    """`status`: a run's summary, once or --watch."""
    p = sub.add_parser("status", help="steps, reward, adapter syncs, staleness, start-up times of a run",
                       description="Summarise a running or finished run started from this directory: containers "
                                   "per host and role, steps, reward, completion length, staleness, adapter syncs.")
    _add_spec(p)
    _add_json(p)
    _add_ssh(p)
    p.add_argument("--plot", metavar="PNG", help="also write reward / length / staleness per step to PNG")
    p.add_argument("--watch", nargs="?", const=10.0, type=_interval, metavar="SECONDS",
                   help="refresh every SECONDS (default 10) until the run ends or Ctrl-C; with --json one JSON "
                        "object per line")
    p.set_defaults(fn=verbs["status"])


def _add_down(sub, verbs: Verbs) -> None:
    """`down`: stop the run's containers."""
    p = sub.add_parser("down", help="stop the run's containers on every host (the shared volume is kept)")
    _add_spec(p)
    _add_ssh(p)
    p.add_argument("--volumes", action="store_true", help="also delete the shared volume (checkpoints, adapters)")
    p.set_defaults(fn=verbs["down"])


def _add_logs(sub, verbs: Verbs) -> None:
    """`logs`: the run's container logs."""
    p = sub.add_parser("logs", help="the run's container logs, per host and role",
                       description="The run's container logs (docker compose logs) from every host, each line "
                                   "prefixed with its host on a multi-host run. --follow streams new lines from all "
                                   "hosts at once until Ctrl-C or the containers stop. What a container wrote is "
                                   "printed without control characters or terminal escapes (colours, titles, links, "
                                   "screen clears) unless --raw.")
    _add_spec(p)
    _add_ssh(p)
    p.add_argument("--role", metavar="ROLE", help="only this role's container (server, trainer, ...)")
    p.add_argument("--host", metavar="NAME", help="only this host (the spec's host name)")
    p.add_argument("--follow", action="store_true", help="keep following new lines")
    p.add_argument("--tail", type=_line_count, default=200, metavar="N",
                   help="lines of history per container first (default 200)")
    p.add_argument("--raw", action="store_true",
                   help="print the containers' output unfiltered, control characters and terminal escapes included "
                        "(by default they are stripped)")
    p.set_defaults(fn=verbs["logs"])


def _add_check(sub, verbs: Verbs) -> None:
    """`check`: testinfra health checks of the spec's hosts."""
    p = sub.add_parser("check", help="testinfra health checks of the spec's hosts (--run: and of the running run)",
                       description="Check every host of the spec with pytest-testinfra (grpo_deploy.hostchecks): run "
                                   "UID owns the shared directory, NFS mount and options, a cross-host write/read as "
                                   "the run identities, Docker and Compose, NVIDIA runtime and GPUs where the profile "
                                   "wants CUDA, checkpoint disk headroom against plan; with --run also the server's "
                                   "health, model, runtime LoRA loading, trainer progress and adapter permissions. "
                                   "One line per check per host; exit 0 all passed, 1 a check failed, 2 could not "
                                   "run. Arguments after -- go to pytest (e.g. -- -k shared_dir).")
    p.add_argument("-f", "--file", metavar="SPEC",
                   help=f"deployment spec (default: $GRPO_DEPLOY_SPEC, else ./{DEFAULT_SPEC})")
    _add_ssh(p)
    p.add_argument("--run", action="store_true", help="also check the running run (pytest --run-checks)")
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS", help="extra pytest arguments, after --")
    p.set_defaults(fn=verbs["check"])


def _add_bench(sub) -> None:
    """`bench trainer`: measured where the work runs (the trainer's forward/backward); its options are the runtime
    module's own (grpo_deploy.runtime.bench.trainer)."""
    bench = sub.add_parser(
        "bench", help="measure where the work runs (trainer: tokens/s, memory, MFU)",
        description="Benchmarks that run where the work runs: inside a trainer image, on its GPU.")
    what = bench.add_subparsers(dest="bench", metavar="WHAT", required=True)
    trainer = what.add_parser(
        "trainer", help="TRL's packed GRPO fwd/bwd: packing off/on x checkpointing, token budget, attention paths",
        description=bench_trainer.__doc__, formatter_class=_Paragraphs)
    bench_trainer.add_arguments(trainer)
    trainer.set_defaults(fn=bench_trainer.run)


def _add_checkpoints(sub, verbs: Verbs) -> None:
    """`checkpoints`: list, verify or prune the run's checkpoints."""
    p = sub.add_parser("checkpoints", help="list, verify or prune the run's checkpoints where they are written",
                       description="The run's checkpoints (TRL checkpoint-N or verl global_step_N) on the host that "
                                   "holds them, read in a throw-away container of the run's image as the run's "
                                   "identity: size, complete or half-written (and why), LoRA rank, world size. "
                                   "verify exits 1 when one is half-written. prune keeps the newest --keep complete "
                                   "ones (default: the spec's checkpoints.keep), removes older complete ones only "
                                   "behind them, and moves half-written ones to quarantine/ (never deletes them).")
    p.add_argument("action", nargs="?", choices=["list", "verify", "prune"], default="list")
    _add_spec(p)
    _add_json(p)
    _add_ssh(p)
    p.add_argument("--keep", type=_keep_count, metavar="N", help="prune: complete checkpoints to keep (1-10000)")
    p.add_argument("--dry-run", action="store_true", help="prune: say what would be removed, change nothing")
    p.set_defaults(fn=verbs["checkpoints"])


def _add_tune(sub, verbs: Verbs) -> None:
    """`tune`: the field write-ups' tuning procedure on the user's own hosts."""
    p = sub.add_parser("tune", help="try one knob at a time in short real trials on these hosts; keep a knob only "
                                    "when it beats the measured noise",
                       description="Short real trials of the spec on its own hosts (each an `up` under a run name of "
                                   "its own, in a scratch folder, saving nothing; the spec's checkpoints are never "
                                   "touched): a baseline, `diagnose` names the bounding side, that side's knobs one "
                                   "value at a time, the baseline repeated between them so the noise is measured; a "
                                   "knob is kept only when its gain beats that noise (judged by samples trained per "
                                   "hour, or with --target by the estimated time to reach that reward). A knob that "
                                   "changes what the loss computes is reported and kept only with "
                                   "--allow-objective-change. Prints a line per trial and a table; writes a JSON "
                                   "report, a plot and the spec diff; --apply rewrites the spec (the old one kept as "
                                   "<spec>.before-tune).")
    _add_spec(p)
    _add_ssh(p)
    p.add_argument("--budget", type=_budget_minutes, default=30.0, metavar="MINUTES",
                   help="wall-clock minutes for all trials (1-10080, default 30); refused when not even the "
                        "baselines and one knob trial fit the forecast")
    p.add_argument("--target", type=_reward_target, metavar="REWARD",
                   help="judge by the estimated time to reach this mean reward (default: the spec's "
                        "watch.target_reward, else samples trained per hour)")
    p.add_argument("--knobs", type=_knob_names, metavar="K,...", help="only these knobs (default: every knob of the "
                                                                         "diagnosed side)")
    p.add_argument("--steps", type=_trial_steps, default=12, metavar="N",
                   help="optimizer steps per trial (6-10000, default 12)")
    p.add_argument("--allow-objective-change", action="store_true",
                   help="keep a knob that is faster but changes what the loss computes (e.g. packing)")
    p.add_argument("--apply", action="store_true", help="write the kept knobs into the spec file")
    p.set_defaults(fn=verbs["tune"])


def _add_diagnose(sub, verbs: Verbs) -> None:
    """`diagnose`: the bottleneck and the next setting to change."""
    p = sub.add_parser("diagnose", help="name the bottleneck (trainer, generation, adapter sync) and the next setting "
                                        "to change",
                       description="Reads the run's own TRL step metrics (forward/backward time, queue fill vs "
                                   "queue_maxsize, time waiting for rollouts, backpressure, adapter-sync time); names "
                                   "the bound side with figures, reward per wall-clock hour and completion length "
                                   "beside tokens/s, and the spec settings to change, in order. Needs 5 timed steps.")
    _add_spec(p)
    _add_json(p)
    _add_ssh(p)
    p.set_defaults(fn=verbs["diagnose"])
