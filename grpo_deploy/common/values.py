"""Validated value types for everything a user controls (names, addresses, paths, image references, env entries,
Hydra overrides): each refuses what could break out of the file it is rendered into, with a message that says why.

Pure (no I/O), shared by the deployer's spec and the trainer's config. Each type is an `Annotated` pydantic type
whose validator raises ValueError with a user-facing reason; the spec loader adds file, line and key.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from grpo_deploy.common.shown import shown

# Control characters (newline, NUL, escape ...) never belong in a value that reaches a rendered file; nor do the
# C1 controls and Unicode line/paragraph separators, where Python's str.splitlines() (the kit's own readers of
# server.args and env files) would split a line that compose and Kubernetes read as one.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Bidirectional controls (embeddings, overrides, isolates, marks): text that reads one way on screen and another to
# the program (Trojan Source); never in a value the kit renders.
BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# The largest integer a consumer of a count or index takes (torch, vLLM and Hydra read them as 32-bit or 64-bit C
# integers; nothing the kit counts comes near 2**31).
MAX_INT = 2**31 - 1
# OCI distribution limits: a repository name of at most 255 characters, a tag of at most 128; a whole reference
# (registry, path, tag, digest) a registry takes stays within a few hundred. The kit allows 512 in all.
MAX_IMAGE_REF = 512
MAX_REPOSITORY = 255
_CONTROL = CONTROL
# Optimizer steps a plan can schedule (a run of a million steps is far past any GRPO recipe).
MAX_STEPS = 10**6
# Gigabytes a disk margin may ask for (a petabyte: past that a float stops being a byte count).
MAX_DISK_GB = 10**6
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
PATH_CHARS = re.compile(r"^[A-Za-z0-9._+@=/-]+$")
ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
INTERFACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}")  # Linux IFNAMSIZ: 15 characters
VOLUME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")
SSH_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
NFS_OPTIONS_RE = re.compile(r"^[A-Za-z0-9_.=-]+(,[A-Za-z0-9_.=-]+)*$")
HYDRA_KEY_RE = re.compile(r"^\+{0,2}[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MODULE_RE = re.compile(r"^[A-Za-z0-9_.]+$")
# The OCI distribution reference grammar: [domain[:port]/]path[:tag][@digest].
_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_RE = re.compile(
    rf"^(?:{_DOMAIN}(?::[0-9]+)?/)?{_PATH}(?:/{_PATH})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
# Env values: what the compose env-file parser and Kubernetes env files read the same way, literally.
ENV_VALUE_FORBIDDEN = set("$\"'`\\#")

# Directories a shared volume or checkpoint dir must never be, or (second list) be inside of; render -o neither.
SYSTEM_DIRS = ("/", "/home", "/opt", "/srv", "/mnt", "/media", "/tmp", "/var", "/root")
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                "/sys", "/usr")
# Paths the kit's images and containers own: the venv, the kit, the run user's HOME (caches), the config mount.
KIT_PATHS = ("/opt/venv", "/opt/grpo-deploy", "/home/grpo", "/etc/grpo-deploy")
# Names whose values are credentials: never in a rendered file.
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY", "CREDENTIAL")


def _text(value: str, what: str) -> str:
    if _CONTROL.search(value):
        raise ValueError(f"{what} contains a control character (newline, tab, NUL ...): {shown(value)}")
    if BIDI.search(value):
        raise ValueError(f"{what} contains a bidirectional control character (U+{ord(BIDI.search(value).group()):04X}),"
                         " which makes text read differently on screen than to a program: remove it")
    return value


def _name(value: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise ValueError("must be 1-42 lowercase letters, digits or '-', starting and ending with a letter or digit")
    return value


def _label(value: str) -> str:
    if not LABEL_RE.fullmatch(value):
        raise ValueError("must be letters, digits, '_', '.' or '-' (up to 128), starting with a letter or digit")
    return value


def abs_path(value: str) -> str:
    _text(value, "the path")
    if not value.startswith("/"):
        raise ValueError(f"{shown(value)} is not an absolute path (it must start with '/')")
    trimmed = value.rstrip("/") or "/"
    if trimmed != "/" and not PATH_CHARS.fullmatch(trimmed):
        bad = sorted({c for c in trimmed if not PATH_CHARS.fullmatch(c)})
        raise ValueError(f"{shown(value)} contains {' '.join(repr(c) for c in bad)}: paths may hold letters, digits "
                         "and "
                         "._+@=-/ only (':' and ',' split mount options, '$' is expanded by compose, spaces split "
                         "arguments)")
    parts = trimmed.split("/")[1:]
    if trimmed != "/" and any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{shown(value)} is not a normalised path (no '//', '.' or '..' components)")
    return trimmed


def _not_system(value: str) -> str:
    if value in SYSTEM_DIRS or any(value == t or value.startswith(t + "/") for t in SYSTEM_TREES):
        raise ValueError(f"{shown(value)} is a system directory (or inside one); use a directory of its own, "
                         "e.g. /shared or /srv/grpo-deploy")
    for kit in KIT_PATHS:
        if value == kit or value.startswith(kit + "/") or kit.startswith(value + "/"):
            raise ValueError(f"{shown(value)} collides with {kit}, which the kit's images use; choose another path")
    return value


def _model_ref(value: str) -> str:
    _text(value, "the model")
    if value.startswith("/"):
        return abs_path(value)
    if not HUB_ID_RE.fullmatch(value) or ".." in value:
        raise ValueError(f"{shown(value)} is neither an absolute path nor a hub id such as Qwen/Qwen2.5-Math-1.5B")
    return value


def _served_name(value: str) -> str:
    _text(value, "the served name")
    if not HUB_ID_RE.fullmatch(value) or ".." in value:
        raise ValueError(f"{shown(value)} is not a model name (letters, digits, '._-', at most one '/')")
    return value


def _matching(pattern: re.Pattern, what: str, form: str) -> Callable[[str], str]:
    """A validator: the whole value matches pattern, else "<value> is not <what> (<form>)"."""

    def check(value: str) -> str:
        _text(value, what)
        if not pattern.fullmatch(value):
            raise ValueError(f"{shown(value)} is not {what} ({form})")
        return value

    return check


@dataclass(frozen=True)
class SshTarget:
    """An SSH target split into parts: user (or None), host (name, IPv4 or IPv6 without brackets), port (or None)."""

    user: str | None
    host: str
    port: int | None


def parse_address(value: str) -> SshTarget:
    """Split `[user@]host[:port]`, `[user@][v6addr]:port` or a bare IPv6 address; ValueError when not one."""
    _text(value, "the address")
    if value.startswith("-"):
        raise ValueError(f"{shown(value)} starts with '-': it would be read as an option")
    user, sep, rest = value.rpartition("@")
    user = user if sep else None
    if user is not None and not SSH_USER_RE.fullmatch(user):
        raise ValueError(f"{shown(user)} is not a user name")
    port: int | None = None
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or (tail and not tail.startswith(":")):
            raise ValueError(f"{shown(value)}: expected [IPv6 address] or [IPv6 address]:port")
        port_text = tail[1:] if tail else None
        _ipv6(host, value)
    elif rest.count(":") >= 2:
        host, port_text = rest, None
        _ipv6(host, value)
    else:
        host, colon, port_text = rest.partition(":")
        port_text = port_text if colon else None
        if not HOSTNAME_RE.fullmatch(host):
            raise ValueError(f"{shown(value)}: {shown(host)} is not a host name, SSH alias or IP address")
    if port_text is not None:
        if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{shown(value)}: the port must be a number from 1 to 65535")
        port = int(port_text)
    return SshTarget(user, host, port)


def _ipv6(host: str, value: str) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        raise ValueError(f"{shown(value)}: {shown(host)} is not an IPv6 address") from None


def _ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{shown(value)} is not an IPv4 or IPv6 address") from None


def host_part(address: str) -> str:
    """The host part of a spec host's address (`[user@]host[:port]`), or "" for `local`."""
    return parse_address(address).host if address != "local" else ""


def ip_literal(host: str) -> str | None:
    """The host part as an IP address when it is one, else None (a name)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def _address(value: str) -> str:
    if value != "local":
        parse_address(value)
    return value


def _host_only(value: str) -> str:
    target = parse_address(value)
    if target.user is not None or target.port is not None:
        raise ValueError(f"{shown(value)}: give the server's host name or IP address alone (no user@ or :port)")
    return value


def _env_name(value: str) -> str:
    if not ENV_NAME_RE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not an environment variable name (upper case letters, digits and _)")
    if any(word in value for word in SECRET_WORDS):
        raise ValueError(f"{shown(value)} looks like a credential: rendered files must not hold secrets; export it in "
                         "the environment of `grpo-deploy up` instead (HF_TOKEN and WANDB_API_KEY are passed through)")
    return value


def env_text(value: Any) -> str:
    """An env value as its text: YAML booleans become 1/0, numbers their decimal form."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a string or a finite number, got {shown(value)}")
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a string or number, got {type(value).__name__}")
    return value


def _env_value(value: str) -> str:
    _text(value, "the value")
    bad = sorted(ENV_VALUE_FORBIDDEN & set(value))
    if bad:
        raise ValueError(f"{shown(value)} contains {' '.join(repr(c) for c in bad)}: env files are read by compose "
                         "(which expands '$' and strips quotes and '#' comments) and by Kubernetes (which does not); "
                         "use a value without them")
    return value



def resume_value(value: str) -> str:
    """checkpoints.resume: auto (the newest complete checkpoint), never, or an absolute checkpoint path."""
    if value in ("auto", "never"):
        return value
    _text(value, "the value")
    if not value.startswith("/"):
        raise ValueError(f"must be auto, never or an absolute checkpoint path, got {shown(value)}")
    return abs_path(value)


def _image_ref(value: str) -> str:
    _text(value, "the image reference")
    if len(value) > MAX_IMAGE_REF:
        raise ValueError(f"an image reference of {len(value)} characters: past the OCI limits (a repository name of "
                         f"at most {MAX_REPOSITORY}, a tag of at most 128; the kit takes {MAX_IMAGE_REF} in all)")
    if not IMAGE_RE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not an image reference ([registry/]name[:tag][@sha256:digest], "
                         "lowercase name)")
    name = value.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    repository = name[:len(name) - len(last)] + last.split(":", 1)[0]
    if len(repository) > MAX_REPOSITORY:
        raise ValueError(f"the repository name is {len(repository)} characters; OCI allows {MAX_REPOSITORY}")
    return value


def _log_steps(value: Any) -> int | float:
    """TRL's logging_steps: an integer from 1, or a ratio of the run in (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number of steps (or a ratio below 1), got {shown(value)}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a positive number of steps, or a ratio of the run below 1, got {shown(value)}")
    if value < 1:
        return float(value)
    if value != int(value) or value > MAX_STEPS:
        raise ValueError(f"from 1 up, a whole number of steps up to {MAX_STEPS} (below 1: a ratio of the run), "
                         f"got {shown(value)}")
    return int(value)


def no_bool(value: Any) -> Any:
    """Before a number or enum: a YAML boolean here was almost always an unquoted on/off/yes/no."""
    if isinstance(value, bool):
        raise ValueError(f"got the boolean {shown(value)}: YAML reads unquoted on/off/yes/no/true/false as booleans; "
                         "quote the word or write the number")
    return value


Text = Annotated[str, AfterValidator(lambda v: _text(v, "the value"))]
Name = Annotated[str, AfterValidator(_name)]
Label = Annotated[str, AfterValidator(_label)]
AbsPath = Annotated[str, AfterValidator(abs_path)]
OwnPath = Annotated[str, AfterValidator(abs_path), AfterValidator(_not_system)]
Resume = Annotated[str, AfterValidator(resume_value)]
ModelRef = Annotated[str, AfterValidator(_model_ref)]
ServedName = Annotated[str, AfterValidator(_served_name)]
VolumeName = Annotated[str, AfterValidator(_matching(
    VOLUME_RE, "a Docker volume name", "letters, digits, '_', '.', '-'"))]
ImageRef = Annotated[str, AfterValidator(_image_ref)]
HostAddress = Annotated[str, AfterValidator(_address)]
InterfaceName = Annotated[str, AfterValidator(_matching(
    INTERFACE_RE, "a network interface name", "up to 15 letters, digits, '_', '.', '-', not starting with '-' or '.'"))]
HostOnly = Annotated[str, AfterValidator(_host_only)]
IpAddress = Annotated[str, AfterValidator(_ip)]
EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, BeforeValidator(env_text), AfterValidator(_env_value)]
NfsOptions = Annotated[str, AfterValidator(_matching(
    NFS_OPTIONS_RE, "a comma-separated list of mount options", "such as nfsvers=4.1,hard"))]
HydraKey = Annotated[str, AfterValidator(_matching(
    HYDRA_KEY_RE, "a Hydra key", "dotted identifiers, optionally prefixed by + or ++"))]
ModuleName = Annotated[str, AfterValidator(_matching(MODULE_RE, "a module name", "letters, digits, '_' and '.'"))]
Uid = Annotated[int, BeforeValidator(no_bool), Field(ge=1, le=2**31 - 2)]
Finite = Annotated[float, BeforeValidator(no_bool), Field(allow_inf_nan=False)]
Count = Annotated[int, BeforeValidator(no_bool), Field(ge=1, le=MAX_INT)]
NonNegative = Annotated[int, BeforeValidator(no_bool), Field(ge=0, le=MAX_INT)]
LogSteps = Annotated[int | float, BeforeValidator(_log_steps)]
MAX_PORT = 65535
Port = Annotated[int, BeforeValidator(no_bool), Field(ge=1, le=MAX_PORT)]


def describe_error(err: dict) -> str:
    """A pydantic error as a user-facing reason: what was wrong, with the value given and what is allowed."""
    kind, msg, given = err["type"], err["msg"], err.get("input")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "is required"
    if kind in ("value_error", "assertion_error"):
        return msg.split(", ", 1)[1] if msg.startswith(("Value error, ", "Assertion failed, ")) else msg
    if kind == "literal_error":
        allowed = msg.removeprefix("Input should be ")
        hint = " (YAML reads unquoted on/off/yes/no as booleans: quote the word)" if isinstance(given, bool) else ""
        return f"{shown(given)} is not one of {allowed}{hint}"
    if given is None:
        return "must be set (got null)"
    hint = ""
    if isinstance(given, bool):
        hint = " (YAML reads unquoted on/off/yes/no/true/false as booleans: quote the word or write the number)"
    elif isinstance(given, str) and kind in ("float_type", "int_type") and re.fullmatch(r"[-+]?0[0-9]+", given):
        hint = " (YAML 1.1 reads a leading 0 as octal, and as text when a digit is 8 or 9: write the plain number)"
    elif isinstance(given, str) and kind in ("float_type", "int_type") and _looks_numeric(given):
        hint = " (YAML 1.1 reads a number like 5e-3 as text: write 5.0e-3)"
    return f"{msg[0].lower() + msg[1:]}, got {shown(given)}{hint}"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# How pydantic names the member of a union (or a validator) in an error's loc: not a key of the spec.
_UNION_TAGS = ("literal[", "function-", "list[", "dict[", "nullable[", "union[")


def error_location(err: dict) -> tuple[tuple[Any, ...], str | None]:
    """Where a pydantic error points (its loc, without pydantic's union/validator tags) and, when a model-level rule
    named its own key as "key: reason", that key appended and the reason alone; else (loc, None)."""
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith(_UNION_TAGS)))
    if err["type"] == "value_error":
        message = describe_error(err)
        key, sep, rest = message.partition(": ")
        if sep and key and re.fullmatch(r"[A-Za-z_+][A-Za-z0-9_.+-]*", key):  # a key, not a quoted value
            return loc + (key,), rest
    return loc, None
