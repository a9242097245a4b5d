"""The replica proxy's command line: its settings (`Settings`, whose defaults the command line shows), the parser with
one-line errors and exit 2, the checks of each value (HOST:PORT, a replica's base URL, the run's adapter folder,
bounded numbers), arguments from an @FILE read bounded, and the settings the parsed arguments give."""

from __future__ import annotations

import argparse
import posixpath
import re
import sys
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from grpo_deploy.common.readback import ReadRefused, read_text
from grpo_deploy.runtime import run_token

ARGS_FILE_LIMIT = 64 * 1024  # an @FILE of arguments: a few hundred lines at most
DESCRIPTION = (
    "The replica proxy: one vLLM base URL in front of N vLLM servers for TRL's async GRPO with adapter sync. "
    "It owns the routing of completions by prompt-prefix affinity, the broadcast of adapter loads (all-or-nothing), "
    "unloads, pause and resume, the fan-in of health and of the model list, each replica's health and adapter "
    "resync, `/proxy/stats`, and its command line (arguments also from an @FILE, read bounded). It passes on only "
    "what TRL 1.16's async GRPO and the kit call; an adapter load must name an adapter folder in --adapter-dir."
)
"""`--help`'s description: what the proxy is (its module, runtime.serving.proxy, runs this command line)."""


@dataclass
class Settings:
    """The proxy's knobs; the command line's defaults come from here."""

    block_size: int = 16
    """Tokens per prefix block: vLLM's default KV block size, so a matching block is a cached one."""
    imbalance: int = 8
    """Requests in flight a replica may have beyond the least loaded one and still win on affinity."""
    load_retry_s: float = 300.0
    """How long an adapter load answered "No adapter found" (a mount that lags) is tried again before 504."""
    connect_timeout_s: float = 2.0
    """Connect timeout to a replica: a dead one is a 502 after this long, never a hang."""
    health_interval_s: float = 2.0
    """Seconds between GET /health probes of each replica."""
    max_blocks: int = 500_000
    """Prefix blocks remembered (least recently used dropped)."""
    adapter_dir: str = ""
    """The run's adapter folder (`<checkpoints.dir>/.vllm_lora`): an adapter load must name a folder in it. Required
    on the command line; empty refuses every load."""
    token: str = field(default="", repr=False)
    """The run's token (runtime/run_token.py), from the proxy's environment (GRPO_RUN_TOKEN), never its command
    line: when set, every request must carry it (`Authorization: Bearer`) or is answered 401 and seen by no replica."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage block
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


_HOST = re.compile(r"[A-Za-z0-9:][A-Za-z0-9.:_-]{0,252}")  # a name, an IPv4 or (without brackets) an IPv6 literal
_PRINTABLE_ASCII = re.compile(r"[!-~]{1,2048}")  # no spaces, control characters or non-ASCII look-alikes


def listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not _HOST.fullmatch(host) or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (ASCII name or address, port 1-65535)")
    return host, int(port)


def replica_url(text: str) -> str:
    if not _PRINTABLE_ASCII.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: printable ASCII only, no spaces")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL with a host")
    if not _HOST.fullmatch(parts.hostname):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the host is not a name or an IP address (letters, digits, . - _ :)"
        )
    if parts.username or parts.password:
        raise argparse.ArgumentTypeError(
            f"{parts.hostname}: credentials do not belong on a command line; "
            "the trainer's own Authorization header is passed on"
        )
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"{text!r}: give the server's base URL (no path or query)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
    return text.rstrip("/")


def adapter_folder(text: str) -> str:
    if not _PRINTABLE_ASCII.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a path: printable ASCII only, no spaces")
    if not text.startswith("/") or text.startswith("//") or posixpath.normpath(text) != text or text == "/":
        raise argparse.ArgumentTypeError(f"{text!r} is not an absolute, normalised folder below / (no .., //, ./)")
    return text


def _number(kind, low, high):
    def parse(text: str):
        try:
            if not _PRINTABLE_ASCII.fullmatch(text):  # int() and float() accept non-ASCII digits
                raise ValueError(text)
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value <= high:  # also refuses nan and infinities
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number, at least {low} and at most {high:g}")
        return value

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Settings()
    parser = _Parser(
        prog="python3 -m grpo_deploy.runtime.serving.proxy",
        description=DESCRIPTION,
        epilog="@FILE reads more arguments from FILE, one per line (# comments skipped): the kit's config/proxy.args.",
    )
    parser.add_argument(
        "--listen",
        type=listen_address,
        default=("127.0.0.1", 8000),
        metavar="HOST:PORT",
        help="where the trainer reaches the proxy (default 127.0.0.1:8000)",
    )
    parser.add_argument(
        "--replica",
        type=replica_url,
        action="append",
        required=True,
        metavar="URL",
        help="a vLLM server's base URL, e.g. http://10.0.0.2:8000 (repeat for each replica)",
    )
    parser.add_argument(
        "--adapter-dir",
        type=adapter_folder,
        required=True,
        metavar="DIR",
        help="the run's adapter folder as the proxy sees it on the share (the trainer's <checkpoints.dir>/.vllm_lora): "
        "an adapter load is passed on only for <DIR>/<its name>, with no link out of DIR",
    )
    parser.add_argument(
        "--block-size",
        type=_number(int, 1, 4096),
        default=d.block_size,
        help=f"tokens per prefix block (default {d.block_size}, vLLM's)",
    )
    parser.add_argument(
        "--imbalance",
        type=_number(int, 0, 100_000),
        default=d.imbalance,
        help=f"requests in flight beyond the least loaded replica before affinity gives way (default {d.imbalance})",
    )
    parser.add_argument(
        "--load-retry-s",
        type=_number(float, 0.0, 86_400.0),
        default=d.load_retry_s,
        help="how long an adapter load that finds no adapter (a mount that lags) is tried again "
        f"before the answer is 504 (default {d.load_retry_s:g})",
    )
    parser.add_argument(
        "--connect-timeout-s",
        type=_number(float, 0.01, 3_600.0),
        default=d.connect_timeout_s,
        help=f"connect timeout to a replica (default {d.connect_timeout_s:g})",
    )
    parser.add_argument(
        "--health-interval-s",
        type=_number(float, 0.01, 3_600.0),
        default=d.health_interval_s,
        help=f"seconds between health probes of each replica (default {d.health_interval_s:g})",
    )
    parser.add_argument(
        "--require-token",
        action="store_true",
        help=f"refuse to start without the run's token in the environment ({run_token.ENV}); with it (given or not), "
             "every request must carry `Authorization: Bearer <token>` or is answered 401",
    )
    parser.add_argument(
        "--max-blocks",
        type=_number(int, 1, 100_000_000),
        default=d.max_blocks,
        help=f"prefix blocks remembered, least recently used dropped (default {d.max_blocks})",
    )
    args = parser.parse_args(_expanded(parser, sys.argv[1:] if argv is None else argv))
    if len(set(args.replica)) != len(args.replica):
        parser.error("--replica: the same URL is given twice")
    try:
        args.token = run_token.of_environ() or ""
    except run_token.RunTokenError as error:
        parser.error(str(error))
    if args.require_token and not args.token:
        parser.error(f"--require-token: {run_token.ENV} is not set: the proxy faces other hosts and passes nothing "
                     "on without the run's token (`grpo-deploy up` passes it from the run's 0600 env file)")
    return args


def _expanded(parser: _Parser, argv: list[str]) -> list[str]:
    """*argv* with each @FILE replaced by its lines (one argument each; blank lines and # comments skipped), the file
    read bounded, no link followed (grpo_deploy.common.readback); not recursive."""
    out: list[str] = []
    for arg in argv:
        if not arg.startswith("@"):
            out.append(arg)
            continue
        try:
            text = read_text(arg[1:], ARGS_FILE_LIMIT, "the proxy's arguments file")
        except ReadRefused as refused:
            parser.error(str(refused))
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
        for n, line in enumerate(lines):  # options and their values only; a stray line is never echoed back
            if not line.startswith("--") and (n == 0 or not lines[n - 1].startswith("--")):
                parser.error(f"{arg[1:]}: not an arguments file (line {n + 1} of its arguments is neither an option "
                             "nor an option's value)")
        out += lines
    return out


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(
        block_size=args.block_size,
        imbalance=args.imbalance,
        load_retry_s=args.load_retry_s,
        connect_timeout_s=args.connect_timeout_s,
        health_interval_s=args.health_interval_s,
        max_blocks=args.max_blocks,
        adapter_dir=args.adapter_dir,
        token=getattr(args, "token", ""),
    )
