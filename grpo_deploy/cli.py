"""The `grpo-deploy` command line: argument parsing and printing only; the work happens in the modules below."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from . import __version__, checks, new_spec, profiles
from .bench import add_bench_parser
from .hosts.connect import HostError, SshOptions
from .image_build.cli import add_images_parser
from .k8s_overlay import OverlayError, overlay_dir, problems, regenerate
from .kit_data import KitDataMissing
from .names import UP_RESTARTS
from .new_spec import InitError
from .profiles import ProfileError
from .render import render_files
from .render_folder import WriteRefused, diff_tree, write_tree
from .render_text import RenderError
from .resolve import Resolved, resolve
from .runtime.table import human_bytes, table
from .spec import ENGINES, SpecError, load

DEFAULT_SPEC = "grpo-deploy.yaml"
EXIT_USAGE = 2
MAX_SIZE = 1e21  # bytes: a zettabyte; --free-space beyond that is a typo


class Parser(argparse.ArgumentParser):
    """argparse with the kit's error format: one line, exit 2 (the usage is one `--help` away)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


class CliError(Exception):
    """An expected failure: printed as one clear message, exit code 2, no traceback."""


# ---------------------------------------------------------------- shared helpers

def _load(args) -> Resolved:
    path = args.file
    if path is None:
        if Path(DEFAULT_SPEC).exists():
            path = DEFAULT_SPEC
        else:
            print(f"note: no -f and no ./{DEFAULT_SPEC}: using the embedded default (cpu rehearsal on this host)",
                  file=sys.stderr)
            return resolve(new_spec.embedded_default())
    return resolve(load(path))


def _parse_size(text: str) -> int:
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


def _free_space(values: list[str] | None, res: Resolved) -> dict[str, int]:
    out = {}
    names = {h.name for h in res.spec.hosts}
    for item in values or []:
        host, sep, size = item.partition("=")
        if not sep or host not in names:
            raise CliError(f"--free-space {item!r}: expected HOST=SIZE with HOST one of {', '.join(sorted(names))}")
        out[host] = _parse_size(size)
    return out


def _host_list(text: str | None) -> list[str]:
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


def _ssh(args) -> SshOptions:
    config = getattr(args, "ssh_config", None)
    if config is not None and not Path(config).is_file():
        raise CliError(f"--ssh-config {config!r}: no such file")
    return SshOptions(config, getattr(args, "accept_new_host_keys", False))


def _add_free_space(p: argparse.ArgumentParser) -> None:
    p.add_argument("--free-space", action="append", metavar="HOST=SIZE",
                   help="what-if: plan as if HOST had SIZE free where checkpoints go (e.g. node1=500GB); repeatable")


# ---------------------------------------------------------------- verbs

def cmd_init(args) -> int:
    text = new_spec.spec_text(args.profile, args.engine, _host_list(args.hosts), args.name)
    out = Path(args.output)
    if out.is_dir() or out.is_symlink():
        raise CliError(f"-o {args.output} is a directory or a link; give a file name such as {DEFAULT_SPEC}")
    if out.exists() and not args.force:
        raise CliError(f"{out} exists; pass --force to overwrite it or -o another file")
    if not out.parent.is_dir():
        raise CliError(f"-o {args.output}: the folder {out.parent} does not exist; create it first")
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"-o {args.output}: cannot write it ({exc.strerror})") from None
    print(f"wrote {out} (profile {args.profile}, engine {args.engine}); next: grpo-deploy plan -f {out}")
    return 0


# Never rendered into (nor anything under them, but / itself only): writing there is always a mistake.
SYSTEM_DIRS = tuple(Path(p) for p in ("/etc", "/usr", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib", "/lib64",
                                      "/boot"))


def cmd_render(args) -> int:
    if not isinstance(args.output, str):  # argparse hands `--output=--` over as []
        raise CliError("-o needs a directory name")
    try:
        return _render(args)
    except OSError as exc:  # a path the OS refuses (a file on the way, a name too long)
        raise CliError(f"-o {args.output}: {exc.strerror or exc}") from None


def _render(args) -> int:
    res = _load(args)
    if args.check:
        out = Path(args.output).resolve()
        return _render_check(out, render_files(res, config_dir=str(out / "config")))
    out = _render_dir(args)
    files = render_files(res, config_dir=str(out / "config"))
    try:
        write_tree(files, out)
    except WriteRefused as exc:
        raise CliError(str(exc)) from None
    print(f"rendered {len(files)} files for run {res.spec.run.name} ({res.engine}) into {out}")
    for rel in sorted(files):
        print(f"  {rel}")
    return 0


def _render_dir(args) -> Path:
    """-o as an absolute path with links resolved, once it is none of: a link, an existing file, the current directory,
    a directory holding the spec being read, a system directory. The rest (a folder that is not new, empty or an
    earlier render; links inside it) is write_tree's to refuse."""
    given = Path(os.path.abspath(args.output))
    if given.is_symlink():
        raise CliError(f"-o {args.output} is a symbolic link; render -o writes only into a real directory: "
                       "pass a new path or the directory itself")
    if given.exists() and not given.is_dir():
        raise CliError(f"-o {args.output} is an existing file, not a directory; pass a new or empty directory")
    out = given.resolve()
    if out == Path.cwd().resolve():
        raise CliError(f"-o {args.output} is the current directory; render into a new or empty directory "
                       "(e.g. -o render)")
    for path in (given, out):
        system = next((s for s in SYSTEM_DIRS if path == s or s in path.parents), None)
        if path == Path(path.anchor) or system:
            where = f"under the system directory {system}" if system else "the root directory"
            raise CliError(f"-o {args.output} is {where}; render into a directory of your own")
    spec = _spec_path(args)
    specs = (Path(os.path.abspath(spec)), spec.resolve()) if spec is not None else ()
    if any(d in s.parents for d in (given, out) for s in specs):
        raise CliError(f"-o {args.output} holds the spec being read ({spec}); render into a directory outside it")
    return out


def _spec_path(args) -> Path | None:
    """The spec file _load reads (None: the embedded default)."""
    if args.file is not None:
        return Path(args.file)
    return Path(DEFAULT_SPEC) if Path(DEFAULT_SPEC).exists() else None


def _render_check(out: Path, files: dict[str, str]) -> int:
    problems = diff_tree(files, out)
    if problems:
        print(f"{out} is out of date with the spec and renderer:")
        print("\n".join(f"  {p}" for p in problems))
        print(f"fix: grpo-deploy render -o {out}")
        return 1
    print(f"{out} matches the renderer ({len(files)} files)")
    return 0


def cmd_plan(args) -> int:
    res = _load(args)
    ctx = checks.Context(res, free_space=_free_space(args.free_space, res))
    plan = ctx.plan()
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2, default=str))
        return 0 if plan.ok else 1
    print(f"run {plan.run}: engine {plan.engine}, model {plan.model}"
          + (f" ({plan.params / 1e6:,.1f} M params, LoRA {plan.lora_params / 1e6:,.2f} M)" if plan.params else ""))
    rows = []
    for h in plan.hosts:
        for m in h.memory:
            detail = ", ".join(f"{k}={v}" for k, v in m.items() if k not in ("role", "why", "fits"))
            rows.append([h.host, h.profile, m.get("role"), h.gpus,
                         {True: "fits", False: "DOES NOT FIT", None: "?"}[m.get("fits")],
                         f"{detail}. {m.get('why', '')}"])
    print(table(["host", "profile", "role", "gpus", "memory", "estimate"], rows))
    if plan.disk:
        d = plan.disk
        print()
        print(f"checkpoints: {human_bytes(d.checkpoint_bytes)} each, saved at steps "
              f"{', '.join(map(str, d.save_steps)) or 'never'} of {d.total_steps}; keep "
              f"{'all' if d.keep is None else d.keep}; adapters on the volume {d.adapters_kept} x "
              f"{human_bytes(d.adapter_bytes)}")
        print(f"disk: need {human_bytes(d.peak_bytes)} at peak on {d.filesystem}; free "
              f"{human_bytes(d.free_bytes)} ({d.free_source}) -> "
              + {True: "OK", False: "DOES NOT FIT", None: "unknown"}[d.fits])
        for line in d.explanation:
            print(f"  - {line}")
    for w in plan.warnings:
        print(f"warning: {w}")
    if args.explain:
        print()
        rows = [[f"{section}.{k}", v["value"], v["source"], v["why"]]
                for section, values in plan.settings.items() for k, v in values.items()]
        print(table(["setting", "value", "from", "why"], rows))
    else:
        print("\n(--explain lists every setting with where it came from and why)")
    return 0 if plan.ok else 1


def cmd_preflight(args) -> int:
    try:
        res = _load(args)
    except SpecError as exc:
        if args.json:
            print(json.dumps({"ok": False, "exit_code": checks.EXIT_COULD_NOT_RUN,
                              "error": "invalid spec", "problems": [str(p) for p in exc.problems]}, indent=2))
            return checks.EXIT_COULD_NOT_RUN
        raise
    ctx = checks.Context(res, free_space=_free_space(args.free_space, res), ssh=_ssh(args))
    try:
        results = checks.run_checks(ctx, only=args.only)
    finally:
        ctx.close()
    if args.json:
        print(checks.to_json(results))
    else:
        print(checks.table_text(results))
        failed = sum(r.verdict == checks.FAIL for r in results)
        print(f"\npreflight: {'FAILED, ' + str(failed) + ' check(s)' if failed else 'all checks passed'}")
    return checks.exit_code(results)


def cmd_profiles(args) -> int:
    rows = []
    for name in profiles.names():
        p = profiles.load(name)
        rows.append([name, ",".join(p.engines), "/".join(p.hardware.get("arch", [])), p.description])
    print(table(["profile", "engines", "arch", "description"], rows))
    return 0


def cmd_up(args) -> int:
    from . import launch

    res = _load(args)
    if args.hosts:
        wanted = _host_list(args.hosts)
        names = [h.name for h in res.spec.hosts]
        if sorted(wanted) != sorted(names):
            raise CliError(f"--hosts {args.hosts!r} does not match the spec's hosts ({', '.join(names)}); "
                           "write a spec for them with: grpo-deploy init --profile P --engine E --hosts "
                           + ",".join(wanted))
    # SIGTERM (a `kill`, a closing terminal, a CI timeout) rolls back like Ctrl-C: what this up started is stopped.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if _remote(res):
            from . import deploy

            return deploy.up(res, _ssh(args), keep=args.keep, fresh=args.fresh, restarts=args.restarts)
        return launch.up(res, keep=args.keep, fresh=args.fresh, restarts=args.restarts)
    except launch.LaunchError as exc:
        raise CliError(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _remote(res: Resolved) -> bool:
    """Whether any host is reached over SSH (the multi-host deployer), else everything runs on this machine."""
    return any(h.address != "local" for h in res.spec.hosts)


def cmd_status(args) -> int:
    res = _load(args)
    if args.watch is None:
        return _status_once(res, args)[0]
    tty = sys.stdout.isatty()
    try:
        while True:  # until the run ends or Ctrl-C
            if tty and not args.json:
                print("\x1b[H\x1b[2J", end="")
            elif not args.json:
                print(f"----- {time.strftime('%H:%M:%S')}")
            code, state = _status_once(res, args)
            sys.stdout.flush()
            if state in ("finished", "failed"):
                return code
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _status_once(res: Resolved, args) -> tuple[int, str]:
    """Print the run's status once (table or JSON); (exit code, run state)."""
    from . import status

    if _remote(res):
        from . import deploy

        hosts, events, disk = deploy.status_facts(res, _ssh(args))
    else:
        from . import launch

        events, hosts = launch.run_events(launch.RunState(res), live=True), launch.host_states(res)
        ctx = checks.Context(res, ssh=_ssh(args))
        try:
            disk = checks.checkpoint_headroom(ctx)
        finally:
            ctx.close()
    summary = status.summarize(res.spec.run.name, events, max_steps=res.engine_info.total_steps(res))
    if args.plot:
        try:
            status.plot(events, args.plot, title=status.plot_title(res.spec.run.name))
        except status.PlotUnavailable as exc:
            raise CliError(f"--plot {args.plot}: {exc}") from None
    if args.json:
        record = {**summary.to_dict(), "checkpoint_disk": disk, **({"hosts": hosts} if hosts else {})}
        print(json.dumps(record, indent=None if args.watch is not None else 2))
    else:
        if hosts:
            print(table(["host", "role", "container", "health"],
                        [[h["host"], h["role"], h["state"], h["health"] or "-"] for h in hosts]) + "\n")
        print(status.summary_text(summary))
        print(checks.headroom_text(disk))
        if args.plot:
            print(f"plot: {args.plot}")
    return (0 if summary.state != "not-started" else 1), summary.state


def cmd_down(args) -> int:
    from . import launch

    res = _load(args)
    try:
        if _remote(res):
            from . import deploy

            dep = deploy.Deployment(res, _ssh(args))
            deploy.down_all(dep, volumes=args.volumes)
            dep.close()
        else:
            launch.down(res, volumes=args.volumes)
    except launch.LaunchError as exc:
        raise CliError(str(exc)) from None
    print("stopped" + (" and removed the shared volume" if args.volumes else " (the shared volume is kept)"))
    return 0


def cmd_logs(args) -> int:
    from . import launch

    res = _load(args)
    roles = [args.role] if args.role else []
    if args.role and args.role not in res.engine_info.roles:
        raise CliError(f"--role {args.role!r}: engine {res.engine} has the roles {', '.join(res.engine_info.roles)}")
    if _remote(res):
        from . import deploy

        dep = deploy.Deployment(res, _ssh(args))
        try:
            return deploy.logs(dep, roles, follow=args.follow, tail=args.tail, host=args.host)
        except (HostError, launch.LaunchError) as exc:
            raise CliError(str(exc)) from None
        finally:
            dep.close()
    if args.host and args.host != "local":
        raise CliError(f"--host {args.host!r}: this run has one host, local")
    try:
        return launch.logs(res, roles, follow=args.follow, tail=args.tail)
    except launch.LaunchError as exc:
        raise CliError(str(exc)) from None


def cmd_check(args) -> int:
    """testinfra checks of every spec host (grpo_deploy.hostchecks) through pytest; exit 0 / 1 / 2."""
    from .hostchecks import runner

    path = args.file or os.environ.get("GRPO_DEPLOY_SPEC") or (DEFAULT_SPEC if Path(DEFAULT_SPEC).exists() else None)
    if path is None:
        raise CliError(f"no spec to check: pass -f SPEC, set GRPO_DEPLOY_SPEC, or write ./{DEFAULT_SPEC} "
                       "(grpo-deploy init)")
    res = resolve(load(path))
    ssh = _ssh(args)
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    try:
        return runner.run(res, os.path.abspath(path), ssh.config_path and os.path.abspath(ssh.config_path),
                          args.run, ssh.accept_new_host_keys, extra)
    except runner.CheckUnavailable as exc:
        raise CliError(str(exc)) from None


def _run_events(res: Resolved, args) -> list[dict]:
    """The run's events (the deployer's and the trainer's), from the hosts when they are remote."""
    from . import launch

    if not _remote(res):
        return launch.run_events(launch.RunState(res), live=True)
    from . import deploy

    dep = deploy.Deployment(res, _ssh(args))
    try:
        return deploy.run_events(dep, live=True)
    finally:
        dep.close()


def cmd_checkpoints(args) -> int:
    from . import checkpoints

    res = _load(args)
    keep = args.keep if args.keep is not None else res.keep
    if args.action == "prune" and keep is None:
        raise CliError("prune: checkpoints.keep is unset in the spec (keep all): pass --keep N")
    ctx = checks.Context(res, ssh=_ssh(args))
    try:
        answer = checkpoints.run_manager(res, ctx, args.action, keep=keep, dry_run=args.dry_run)
    except (checkpoints.CheckpointsError, HostError) as exc:
        raise CliError(str(exc)) from None
    finally:
        ctx.close()
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(checkpoints.prune_text(answer) if args.action == "prune" else checkpoints.listing_text(answer))
    return 1 if answer["exit_code"] != 0 else 0


def cmd_diagnose(args) -> int:
    from . import diagnose

    res = _load(args)
    res.engine_info.refuse("diagnose", CliError)
    d = diagnose.diagnose(_run_events(res, args), diagnose.settings_hint(res))
    print(json.dumps(d.to_dict(), indent=2) if args.json else diagnose.diagnosis_text(d))
    return 1 if d.side == "not enough data" else 0


# ---------------------------------------------------------------- parser

def cmd_k8s_render(args) -> int:
    overlay = overlay_dir(args.overlay)
    written = regenerate(overlay)
    print(f"rendered {len(written)} files into {overlay}/generated/ from {overlay}/spec.yaml")
    return 0


def cmd_k8s_check(args) -> int:
    overlay = overlay_dir(args.overlay)
    found = problems(overlay)
    if found:
        more = f" (and {len(found) - 1} more: run again after fixing this)" if len(found) > 1 else ""
        raise CliError(found[0] + more)
    print(f"{overlay}: ready: as a cluster admin `kubectl apply -k {overlay}/admin` (when it has one), then "
          f"`kubectl apply -k {overlay}`")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="grpo-deploy",
        description="Render, check and launch GRPO + LoRA post-training deployments "
                    "(TRL async GRPO + vLLM server, or verl) from one spec and hardware profiles.",
        epilog="Typical flow: init -> plan -> preflight -> up -> status. Every verb has --help.",
    )
    parser.add_argument("--version", action="version", version=f"grpo-deploy {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = sub.add_parser("init", help="write a commented deployment spec from a hardware profile",
                       description="Write a commented spec with every key, filled from a hardware profile.")
    p.add_argument("--profile", required=True, choices=profiles.names(), help="hardware profile (grpo-deploy profiles)")
    p.add_argument("--engine", required=True, choices=ENGINES, help="training engine")
    p.add_argument("--hosts", help="comma-separated SSH hosts; trl-async: 'trainer,server' (e.g. spark1,spark2) or one "
                                   "host for both roles; verl: head first, then workers. Default: this machine")
    p.add_argument("--name", help="run name (default: from profile and engine)")
    p.add_argument("-o", "--output", default=DEFAULT_SPEC, type=_output_path,
                   help=f"file to write (default {DEFAULT_SPEC})")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(fn=cmd_init)

    p = sub.add_parser("render", help="write every artifact (vLLM args, trainer config, compose env, verl overrides)",
                       description="Render every artifact of the run into DIR: a new or empty directory, or an "
                                   "earlier render, whose record (.grpo-deploy-render) lists the files the kit wrote: "
                                   "only those are replaced or removed, nothing else is touched. With --check, compare "
                                   "the directory with a fresh render and exit 1 on any "
                                   "difference.")
    _add_spec(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", type=_output_path, help="output directory")
    p.add_argument("--check", action="store_true", help="diff DIR against a fresh render instead of writing")
    p.set_defaults(fn=cmd_render)

    p = sub.add_parser("k8s", help="a Kubernetes overlay (k8s/<name>/): render its generated/, check it before apply")
    k8s = p.add_subparsers(dest="k8s_verb", metavar="ACTION", required=True, parser_class=Parser)
    q = k8s.add_parser("render", help="rewrite OVERLAY/generated/ from OVERLAY/spec.yaml (only files the kit wrote)")
    q.add_argument("overlay", metavar="OVERLAY", help="an overlay folder, e.g. k8s/h200")
    q.set_defaults(fn=cmd_k8s_render)
    q = k8s.add_parser("check", help="refuse an overlay that still holds a placeholder (NFS address, registry) or a "
                                     "stale generated/; exit 0 when it is ready for kubectl apply -k")
    q.add_argument("overlay", metavar="OVERLAY", help="an overlay folder, e.g. k8s/h200")
    q.set_defaults(fn=cmd_k8s_check)

    p = sub.add_parser("plan", help="what runs where, memory fit, checkpoint size and disk need per host",
                       description="Plan the run: roles and GPUs per host, memory fit (rough estimates), checkpoint "
                                   "size, save schedule, and disk need against the real free space. Exit 1 when "
                                   "something does not fit.")
    _add_spec(p)
    _add_json(p)
    _add_free_space(p)
    p.add_argument("--explain", action="store_true", help="list every setting with its source and reason")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("preflight", help="run every check; table or --json; exit 0 ok, 1 failed, 2 could not run",
                       description="Check every precondition before anything starts: spec, identity (UID/umask), "
                                   "Docker engine, architecture, disk headroom, logger credentials, images.")
    _add_spec(p)
    _add_json(p)
    _add_free_space(p)
    p.add_argument("--only", action="append", metavar="CHECK", choices=checks.names(),
                   help=f"run only this check (repeatable): {', '.join(checks.names())}")
    _add_ssh(p)
    p.set_defaults(fn=cmd_preflight)

    p = sub.add_parser("profiles", help="list the hardware profiles")
    p.set_defaults(fn=cmd_profiles)

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
    p.add_argument("--fresh", action="store_true", help="delete this run's directory on the shared volume first "
                                                         "(default: resume from the newest complete checkpoint)")
    p.add_argument("--restarts", type=_restart_count, default=UP_RESTARTS, metavar="N",
                   help="when the vLLM server dies mid-run, restart the server and the trainer (which resumes from "
                        f"its newest complete checkpoint) up to N times (0-10, default {UP_RESTARTS})")
    p.set_defaults(fn=cmd_up)

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
    p.set_defaults(fn=cmd_status)

    p = sub.add_parser("down", help="stop the run's containers on every host (the shared volume is kept)")
    _add_spec(p)
    _add_ssh(p)
    p.add_argument("--volumes", action="store_true", help="also delete the shared volume (checkpoints, adapters)")
    p.set_defaults(fn=cmd_down)

    p = sub.add_parser("logs", help="the run's container logs, per host and role",
                       description="The run's container logs (docker compose logs) from every host, each line "
                                   "prefixed with its host on a multi-host run. --follow streams new lines from all "
                                   "hosts at once until Ctrl-C or the containers stop.")
    _add_spec(p)
    _add_ssh(p)
    p.add_argument("--role", metavar="ROLE", help="only this role's container (server, trainer, ...)")
    p.add_argument("--host", metavar="NAME", help="only this host (the spec's host name)")
    p.add_argument("--follow", action="store_true", help="keep following new lines")
    p.add_argument("--tail", type=_line_count, default=200, metavar="N",
                   help="lines of history per container first (default 200)")
    p.set_defaults(fn=cmd_logs)

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
    p.set_defaults(fn=cmd_check)

    add_bench_parser(sub)
    add_images_parser(sub)

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
    p.set_defaults(fn=cmd_checkpoints)

    p = sub.add_parser("diagnose", help="name the bottleneck (trainer, generation, adapter sync) and the next setting "
                                        "to change",
                       description="Reads the run's own TRL step metrics (forward/backward time, queue fill vs "
                                   "queue_maxsize, time waiting for rollouts, backpressure, adapter-sync time); names "
                                   "the bound side with figures, reward per wall-clock hour and completion length "
                                   "beside tokens/s, and the spec settings to change, in order. Needs 5 timed steps.")
    _add_spec(p)
    _add_json(p)
    _add_ssh(p)
    p.set_defaults(fn=cmd_diagnose)

    return parser


def main(argv: list[str] | None = None) -> int:
    """The one error path: input errors -> one line each, exit 2; a check that ran and failed -> exit 1."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except SpecError as exc:
        print("error: the spec is not valid; nothing was written or started:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_USAGE
    except (CliError, InitError, ProfileError, HostError, RenderError, KitDataMissing, OverlayError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and closed: not an error of the run
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
