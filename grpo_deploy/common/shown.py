"""How an error message shows a value or key the user gave: a short, scrubbed prefix, never a whole scalar (it may be
a credential planted in the spec, or a line of a file the kit did not expect to read), always one printable line; and
how text the kit did not write (what a container or a host's command wrote: metrics, events, logs, checkpoint
metadata) is printed: `printable`, with no control character or terminal escape left.

Pure standard library; every message of the door that quotes a value goes through `shown`, every key through
`shown_key`; an unknown key's message offers the closest known one (`did_you_mean`)."""

from __future__ import annotations

import difflib
import re

SHORT = 24  # a value up to this long is shown whole (unless it looks like a credential)
PREFIX = 12  # a longer one: this many characters, then "..." and its length
# Prefixes of well-known credential formats (Hugging Face, GitHub, OpenAI-style, Slack, AWS, GitLab, W&B local).
_CREDENTIAL_PREFIXES = ("hf_", "api_org_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "sk-", "xox",
                        "AKIA", "ASIA", "glpat-", "local-")
# A run of token characters long enough to be a key, with letters and digits mixed (a path or a word is not).
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_+/=-]{20,}")
# Hash shapes: crypt(3) ($id$salt$hash), bcrypt, htpasswd's apr1, a bare hex digest of 32+ characters.
_HASH = re.compile(r"\$(?:1|2[abxy]?|5|6|y|apr1|argon2(?:id|i|d)?|scrypt|pbkdf2[^$]*)\$"
                   r"|^(?=.*[a-fA-F])(?=.*[0-9])[0-9a-fA-F]{32,}$")


# Terminal escapes (ECMA-48), by ESC or by their 8-bit (C1) introducer: a control string (OSC: titles, hyperlinks; DCS,
# SOS, PM, APC) up to its terminator (BEL or ST) or the end of the line; a control sequence (CSI); any other escape.
_ESCAPES = re.compile(r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
                      r"|(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
                      r"|\x1b[\x20-\x2f]*[\x30-\x7e]?")
# What is left to drop: C0 controls but newline and tab, DEL, C1, and the bidi overrides and isolates that can make
# a line read otherwise than it is (U+202A-202E, U+2066-2069).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """*text* as the kit prints what it did not write itself (a container's metrics, events, logs, checkpoint
    metadata, a host's command output): terminal escape sequences removed whole, then every control character but
    newline and tab, DEL, C1 and the bidi overrides. Lines stay lines; nothing else changes."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text if isinstance(text, str) else str(text)))


def looks_secret(text: str) -> bool:
    """Whether *text* has the shape of a credential or a password hash (so not even a prefix of it is shown)."""
    stripped = text.strip()
    if stripped.startswith(_CREDENTIAL_PREFIXES) and len(stripped) >= 8:
        return True
    if _HASH.search(stripped):
        return True
    for run in _TOKEN_RUN.findall(stripped):
        if "/" in run and run.count("/") > 1:  # a path
            continue
        kinds = sum(bool(re.search(p, run)) for p in ("[a-z]", "[A-Z]", "[0-9]"))
        if kinds == 3 or (kinds == 2 and re.search("[0-9]", run) and len(run) >= 32):
            return True
    return False


def shown(value: object) -> str:
    """*value* for a message: booleans, None and short numbers as they are; a string quoted and escaped, whole when
    short, else its first PREFIX characters and its length; a credential-shaped string by its length only."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= SHORT else f"{text[:PREFIX]}... (a number of {len(text)} characters)"
    if isinstance(value, str):
        if looks_secret(value):
            return f"<a value of {len(value)} characters, not shown: it looks like a credential>"
        if len(value) <= SHORT:
            return _quoted(value)
        return f"{_quoted(value[:PREFIX])[:-1]}...' ({len(value)} characters)"
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key(s)"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item(s)"
    return f"a {type(value).__name__}"


def _quoted(text: str) -> str:
    """Single-quoted, with every unprintable character (controls, bidi overrides, separators) escaped."""
    body = "".join(c if c.isprintable() and c not in "'\\" else (f"\\{c}" if c in "'\\" else
                                                                  f"\\u{ord(c):04x}" if ord(c) < 0x10000 else
                                                                  f"\\U{ord(c):08x}") for c in text)
    return f"'{body}'"


def shown_key(key: object) -> str:
    """A mapping key for a message: as it is (quoted and escaped when it holds an unprintable character) when it is
    at most 64 characters and not shaped like a credential or hash, else described by its length (a key is text the
    user may not have meant as a key: a line of another file, a pasted credential)."""
    if isinstance(key, str) and len(key) <= 64 and not looks_secret(key):
        return key if key.isprintable() else repr(key)
    if isinstance(key, str):
        return f"<a key of {len(key)} characters>"
    return shown(key)


def did_you_mean(word: str, choices) -> str:
    """'; did you mean X?' for the closest known name, or ''."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""
