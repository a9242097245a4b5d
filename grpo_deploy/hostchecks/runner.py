"""What `grpo-deploy check` runs: pytest on this package with one testinfra host per spec host, its own output turned
off, one line per check per host printed as each finishes (failures with their message), a summary, and the exit
code: 0 every check passed, 1 a check failed, 2 the checks could not run."""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass, field

from grpo_deploy.hostchecks.targets import hostspecs

EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2
INSTALL_HINT = "pip install 'grpo-deploy[check]'"


class CheckUnavailable(RuntimeError):
    """pytest or pytest-testinfra is not installed."""


def pytest_args(res, spec_path: str, ssh_config: str | None = None, run: bool = False,
                accept_new_host_keys: bool = False, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The pytest command line that checks every host of *res* (read from *spec_path*)."""
    args = ["-p", "grpo_deploy.hostchecks.plugin", "--pyargs", "grpo_deploy.hostchecks",
            f"--hosts={','.join(hostspecs(res))}", f"--spec={spec_path}", "-p", "no:cacheprovider", "-q",
            "--no-header", "--tb=short"]
    if ssh_config:
        args.append(f"--ssh-config={ssh_config}")
    if run:
        args.append("--run-checks")
    if accept_new_host_keys:
        args.append("--accept-new-host-keys")
    return args + list(extra)


def _message(report) -> str:
    """A failed or skipped check's message, without pytest's assertion rewrite or the exception class."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, "Skipped: reason")
        return longrepr[2].removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr)
    for prefix in ("AssertionError: ", "Failed: ", "AssertionError"):
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    return text.split("\nassert ")[0].strip()


@dataclass(eq=False)
class Lines:
    """A pytest plugin: prints one line per check per host as it finishes and counts verdicts."""

    out: io.TextIOBase = field(default_factory=lambda: sys.stdout)
    counts: dict[str, int] = field(default_factory=lambda: {"PASS": 0, "FAIL": 0, "SKIP": 0})
    failed: list[str] = field(default_factory=list)

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed) or \
                (report.when == "teardown" and report.failed):
            verdict = "PASS" if report.passed else ("SKIP" if report.skipped else "FAIL")
            host = dict(report.user_properties).get("host", "-")
            check = report.nodeid.split("::")[-1].split("[")[0].removeprefix("test_")
            self.counts[verdict] += 1
            line = f"{verdict}  {host:<16} {check:<36}"
            if verdict != "PASS":
                line += f" {_message(report)}"
            if verdict == "FAIL":
                self.failed.append(f"{host} {check}")
            print(line.rstrip(), file=self.out, flush=True)

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.counts["FAIL"] += 1
            print(f"FAIL  {'-':<16} {'collect ' + report.nodeid:<36} {_message(report)}", file=self.out, flush=True)


def run(res, spec_path: str, ssh_config: str | None = None, run_checks: bool = False,
        accept_new_host_keys: bool = False, extra: list[str] | tuple[str, ...] = (), out=None, err=None) -> int:
    """Check every host of *res*; print a line per check per host; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        import pytest
        import testinfra  # noqa: F401
    except ImportError as exc:
        raise CheckUnavailable(f"grpo-deploy check needs pytest and pytest-testinfra ({exc.name} is not installed): "
                               f"{INSTALL_HINT}") from None
    args = pytest_args(res, spec_path, ssh_config, run_checks, accept_new_host_keys, extra)
    lines = Lines(out)
    print(f"checking {len(res.spec.hosts)} host(s) of {spec_path}: "
          + ", ".join(f"{h.name} ({h.address})" for h in res.spec.hosts)
          + (" and the running run" if run_checks else ""), file=out, flush=True)
    pytest_output = io.StringIO()
    with contextlib.redirect_stdout(pytest_output):
        code = int(pytest.main(args, plugins=[lines]))
    c = lines.counts
    if code in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and sum(c.values()):
        print(f"{c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped", file=out)
        return EXIT_FAILED if c["FAIL"] or code == pytest.ExitCode.TESTS_FAILED else EXIT_OK
    if code == pytest.ExitCode.INTERRUPTED and sum(c.values()):
        print(f"interrupted: {c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped", file=out)
        return EXIT_FAILED if c["FAIL"] else EXIT_COULD_NOT_RUN
    why = {pytest.ExitCode.NO_TESTS_COLLECTED: "no check was selected (check the pytest arguments after --)"}.get(
        code, f"pytest exit {code}")
    print(f"error: the checks could not run: {why}", file=err)
    tail = pytest_output.getvalue().strip()
    if tail:
        print("\n".join(tail.splitlines()[-30:]), file=err)
    return EXIT_COULD_NOT_RUN
