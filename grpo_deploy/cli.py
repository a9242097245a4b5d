"""The `grpo-deploy` verbs: each reads its arguments, calls the library and prints; the grammar is
grpo_deploy.cli_parser's, the work happens in the modules below (a run on its hosts: grpo_deploy.deploy)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from grpo_deploy import forecast, preflight
from grpo_deploy.cli_parser import DEFAULT_SPEC, EXIT_USAGE, CliError, build_parser, host_list, parse_size
from grpo_deploy.common.readback import ReadRefused
from grpo_deploy.common.shown import printable, shown
from grpo_deploy.common.table import table
from grpo_deploy.common.term import columns, escapes_ok, fit
from grpo_deploy.common.values import ENV_VALUE_FORBIDDEN, SYSTEM_TREES
from grpo_deploy.hosts.connect import HostError, SshOptions
from grpo_deploy.kit_data import KitDataMissing
from grpo_deploy.names import STATE_DIR
from grpo_deploy.plan import plan_text
from grpo_deploy.render import render_files
from grpo_deploy.render.folder import WriteFailed, WriteRefused, diff_tree, write_tree
from grpo_deploy.render.k8s_overlay import OverlayError, overlay_dir, problems, regenerate, secret_lines
from grpo_deploy.spec import new_spec, profiles
from grpo_deploy.spec.load import load
from grpo_deploy.spec.new_spec import InitError
from grpo_deploy.spec.profiles import ProfileError
from grpo_deploy.spec.resolve import Resolved, resolve
from grpo_deploy.spec.schema import SpecError
from grpo_deploy.templating import RenderError

# ---------------------------------------------------------------- shared helpers

def _load(args) -> Resolved:
    path = args.file
    if path is None:
        if Path(DEFAULT_SPEC).exists():
            path = DEFAULT_SPEC
        else:
            print(fit(f"no -f and no ./{DEFAULT_SPEC}: using the embedded default (cpu rehearsal on this host)",
                      sys.stderr, "note: "), file=sys.stderr)
            return resolve(new_spec.embedded_default())
    return resolve(load(path))


def _free_space(values: list[str] | None, res: Resolved) -> dict[str, int]:
    out = {}
    names = {h.name for h in res.spec.hosts}
    for item in values or []:
        host, sep, size = item.partition("=")
        if not sep or host not in names:
            raise CliError(f"--free-space {item!r}: expected HOST=SIZE with HOST one of {', '.join(sorted(names))}")
        out[host] = parse_size(size)
    return out


def _ssh(args) -> SshOptions:
    config = getattr(args, "ssh_config", None)
    if config is not None and not Path(config).is_file():
        raise CliError(f"--ssh-config {config!r}: no such file")
    return SshOptions(config, getattr(args, "accept_new_host_keys", False))


# ---------------------------------------------------------------- verbs

def cmd_init(args) -> int:
    text = new_spec.spec_text(args.profile, args.engine, host_list(args.hosts), args.name)
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
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM rolls back like Ctrl-C: the earlier render stays
    try:
        write_tree(files, out)
    except WriteFailed as exc:  # a full disk: one line, exit 2 like every other -o the OS refuses
        raise CliError(f"render -o {args.output}: {exc.reason}") from None
    except WriteRefused as exc:
        raise CliError(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
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
    for path in (given, out):  # never / itself, nor in a system tree (the trees a spec path may not be in either)
        system = next((s for s in map(Path, SYSTEM_TREES) if path == s or s in path.parents), None)
        if path == Path(path.anchor) or system:
            where = f"under the system directory {system}" if system else "the root directory"
            raise CliError(f"-o {args.output} is {where}; render into a directory of your own")
    bad = sorted({c for path in (given, out) for c in str(path) if c in OUT_DIR_FORBIDDEN or not c.isprintable()
                  or c.isspace()})
    if bad:
        raise CliError(f"-o {shown(args.output)}: the folder's path holds {' '.join(repr(c) for c in bad)}, and the "
                       "rendered env files name files in it (COMPOSE_FILE splits at ':', compose expands '$' and "
                       "strips quotes and '#'); render into a path without them")
    spec = _spec_path(args)
    specs = (Path(os.path.abspath(spec)), spec.resolve()) if spec is not None else ()
    if any(d in s.parents for d in (given, out) for s in specs):
        raise CliError(f"-o {args.output} holds the spec being read ({spec}); render into a directory outside it")
    return out


# Characters a render folder's path may not hold: its files are named in the env files' COMPOSE_FILE.
OUT_DIR_FORBIDDEN = frozenset(ENV_VALUE_FORBIDDEN | {":"})


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


def _forecast(res: Resolved) -> forecast.Forecast:
    """The forecast of *res*, from this run name's own metrics where the deployer kept a copy (this folder's
    .grpo-deploy/<run>/), read through the bounded reader."""
    from grpo_deploy.deploy.run_state import RunState

    state = RunState(res)
    where = f"{STATE_DIR}/{res.spec.run.name}/"
    try:
        events, note = state.saved_events(), ""
    except ReadRefused as exc:
        events, note = [], f"run {res.spec.run.name}'s metrics not read ({exc})"
    from grpo_deploy.tune.report import measured_factors
    from grpo_deploy.tune.session import TUNE_DIR

    return forecast.make_forecast(res, events, where, note, tuned=measured_factors(TUNE_DIR, res.spec.run.name))


def cmd_plan(args) -> int:
    res = _load(args)
    ctx = preflight.Context(res, free_space=_free_space(args.free_space, res))
    plan = ctx.plan()
    fc = _forecast(res)
    if args.json:
        print(json.dumps({**plan.to_dict(), "forecast": fc.to_dict()}, indent=2, default=str))
        return 0 if plan.ok else 1
    width = columns(sys.stdout)  # None off a terminal: lines stay whole (grep-able)
    print(fit(plan_text(plan, forecast.forecast_text(fc, width), explain=args.explain), sys.stdout))
    return 0 if plan.ok else 1


def cmd_preflight(args) -> int:
    try:
        res = _load(args)
    except SpecError as exc:
        if args.json:
            print(json.dumps({"ok": False, "exit_code": preflight.EXIT_COULD_NOT_RUN,
                              "error": "invalid spec", "problems": [str(p) for p in exc.problems]}, indent=2))
            return preflight.EXIT_COULD_NOT_RUN
        raise
    ctx = preflight.Context(res, free_space=_free_space(args.free_space, res), ssh=_ssh(args))
    try:
        results = preflight.run_checks(ctx, only=args.only)
    finally:
        ctx.close()
    if args.json:
        print(preflight.to_json(results))
    else:
        print(preflight.table_text(results))
        failed = sum(r.verdict == preflight.FAIL for r in results)
        print(f"\npreflight: {'FAILED, ' + str(failed) + ' check(s)' if failed else 'all checks passed'}")
    return preflight.exit_code(results)


def cmd_profiles(args) -> int:
    rows = []
    for name in profiles.names():
        p = profiles.load(name)
        rows.append([name, ",".join(p.engines), "/".join(p.hardware.get("arch", [])), p.description])
    print(table(["profile", "engines", "arch", "description"], rows))
    return 0


def cmd_up(args) -> int:
    from grpo_deploy import deploy as deployer

    res = _load(args)
    if args.hosts:
        wanted = host_list(args.hosts)
        names = [h.name for h in res.spec.hosts]
        if sorted(wanted) != sorted(names):
            raise CliError(f"--hosts {args.hosts!r} does not match the spec's hosts ({', '.join(names)}); "
                           "write a spec for them with: grpo-deploy init --profile P --engine E --hosts "
                           + ",".join(wanted))
    # SIGTERM (a `kill`, a closing terminal, a CI timeout) rolls back like Ctrl-C: what this up started is stopped.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return deployer.up(res, _ssh(args), keep=args.keep, fresh=args.fresh, restarts=args.restarts,
                           scratch=args.scratch)
    except deployer.LaunchError as exc:
        raise CliError(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")



def cmd_status(args) -> int:
    from grpo_deploy import status

    res = _load(args)
    if args.watch is None:
        return _status_once(res, args)[0]
    redraw = escapes_ok(sys.stdout)  # the screen cleared between two looks; else a dated separator line
    try:
        while True:  # until the run ends or Ctrl-C
            if redraw and not args.json:
                print("\x1b[H\x1b[2J", end="")
            elif not args.json:
                print(f"----- {time.strftime('%H:%M:%S')}")
            code, state = _status_once(res, args)
            sys.stdout.flush()
            if state in status.ENDED:
                return code
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _status_once(res: Resolved, args) -> tuple[int, str]:
    """Print the run's status once (table or JSON); (exit code, run state)."""
    from grpo_deploy import deploy as deployer
    from grpo_deploy import status

    hosts, events, disk = deployer.status_facts(res, _ssh(args))
    summary = status.summarize(res.spec.run.name, events, max_steps=res.engine_info.total_steps(res),
                               watch=res.engine_info.watch(res))
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
                        [[h["host"], h.get("service", h["role"]), h["state"], h["health"] or "-"]
                         for h in hosts]) + "\n")
        print(status.summary_text(summary))
        print(preflight.headroom_text(disk))
        if args.plot:
            print(f"plot: {args.plot}")
    return (0 if summary.state != "not-started" else 1), summary.state


def cmd_down(args) -> int:
    from grpo_deploy import deploy as deployer

    res = _load(args)
    try:
        deployer.down(res, _ssh(args), volumes=args.volumes)
    except deployer.LaunchError as exc:
        raise CliError(str(exc)) from None
    print("stopped" + (" and removed the shared volume" if args.volumes else " (the shared volume is kept)"))
    return 0


def cmd_logs(args) -> int:
    from grpo_deploy import deploy as deployer

    res = _load(args)
    try:
        return deployer.logs(res, _ssh(args), [args.role] if args.role else [], follow=args.follow, tail=args.tail,
                             host=args.host, raw=args.raw)
    except deployer.LaunchError as exc:
        raise CliError(str(exc)) from None


def cmd_check(args) -> int:
    """testinfra checks of every spec host (grpo_deploy.hostchecks) through pytest; exit 0 / 1 / 2."""
    from grpo_deploy.hostchecks import runner

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
    """The run's events (the deployer's and the trainer's), live from its hosts."""
    from grpo_deploy import deploy as deployer

    return deployer.events(res, _ssh(args))


def cmd_checkpoints(args) -> int:
    from grpo_deploy.deploy import checkpoints

    res = _load(args)
    keep = args.keep if args.keep is not None else res.keep
    if args.action == "prune" and keep is None:
        raise CliError("prune: checkpoints.keep is unset in the spec (keep all): pass --keep N")
    ctx = preflight.Context(res, ssh=_ssh(args))
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
    from grpo_deploy import status
    from grpo_deploy.diagnose.base import diagnosis_text

    res = _load(args)
    res.engine_info.refuse("diagnose", CliError)
    events = _run_events(res, args)
    d, labels = res.engine_info.diagnose(events, res)
    watched = status.summarize(res.spec.run.name, events, max_steps=res.engine_info.total_steps(res),
                               watch=res.engine_info.watch(res))  # the run watcher's view beside the bottleneck
    if args.json:
        print(json.dumps({**d.to_dict(), "watch": watched.watch, "watch_findings": watched.watch_findings,
                          "skipped_lines": watched.skipped_lines}, indent=2))
    else:
        print("\n".join([diagnosis_text(d, labels), *status.watch_lines(watched), *status.note_lines(watched)]))
    return 1 if d.side == "not enough data" else 0


def cmd_k8s_render(args) -> int:
    overlay = overlay_dir(args.overlay)
    written = regenerate(overlay)
    print(f"rendered {len(written)} files into {overlay}/generated/ from {overlay}/spec.yaml")
    for line in secret_lines(overlay):
        print(line)
    return 0


def cmd_k8s_check(args) -> int:
    overlay = overlay_dir(args.overlay)
    found = problems(overlay)
    if found:
        more = f" (and {len(found) - 1} more: run again after fixing this)" if len(found) > 1 else ""
        raise CliError(found[0] + more)
    print(f"{overlay}: ready: as a cluster admin `kubectl apply -k {overlay}/admin` (when it has one), then "
          f"`kubectl apply -k {overlay}`")
    for line in secret_lines(overlay):
        print(line)
    return 0


def cmd_tune(args) -> int:
    from grpo_deploy.common.readback import read_text
    from grpo_deploy.tune import loop, session

    res = _load(args)
    spec_file = Path(args.file) if args.file else (Path(DEFAULT_SPEC) if Path(DEFAULT_SPEC).exists() else None)
    target = args.target if args.target is not None else res.spec.watch.target_reward
    if target is not None and not 0 < target <= 1:
        raise CliError(f"watch.target_reward {target:g}: tune judges by it, and the kit's rewards are 0..1 per answer; "
                       "set it above 0 and at most 1, or pass --target")
    request = loop.TuneRequest(args.budget * 60, target, args.knobs, args.steps, args.allow_objective_change)
    text = read_text(spec_file, 1 << 20, "the spec") if spec_file is not None else new_spec.spec_text()
    ssh = (["--ssh-config", args.ssh_config] if args.ssh_config else []) + \
        (["--accept-new-host-keys"] if args.accept_new_host_keys else [])
    try:
        return session.run(res, session.user_data(text), request, spec_file, args.apply, ssh,
                           lambda line: print(printable(line), flush=True))
    except session.TuneRefused as exc:
        raise CliError(str(exc)) from None


VERBS = {"init": cmd_init, "render": cmd_render, "k8s-render": cmd_k8s_render, "k8s-check": cmd_k8s_check,
         "plan": cmd_plan, "preflight": cmd_preflight, "profiles": cmd_profiles, "up": cmd_up, "status": cmd_status,
         "down": cmd_down, "logs": cmd_logs, "check": cmd_check, "checkpoints": cmd_checkpoints,
         "diagnose": cmd_diagnose, "tune": cmd_tune}


def main(argv: list[str] | None = None) -> int:
    """The one error path: input errors -> one line each, exit 2; a check that ran and failed -> exit 1."""
    parser = build_parser(VERBS)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except SpecError as exc:
        print("error: the spec is not valid; nothing was written or started:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_USAGE
    except (CliError, InitError, ProfileError, HostError, RenderError, KitDataMissing, OverlayError,
            ReadRefused) as exc:
        print(f"error: {printable(exc)}", file=sys.stderr)  # it may quote what a host or container said
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and closed: not an error of the run
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
