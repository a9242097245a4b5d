"""The door of `grpo-deploy images`: every flag value (tag, uid/gid, folder, suite, mirror URL) checked into a type
once; a refusal is one line saying what was wrong and how to write it."""

from __future__ import annotations

import argparse
import re

from grpo_deploy.common.values import CONTROL

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = re.compile(rf"(?:{_COMPONENT}(?::[0-9]{{1,5}})?/)?{_COMPONENT}(?:/{_COMPONENT})*"
                  r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_URL = re.compile(r"(?:https?|file)://[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]+")
MAX_ID = 2**31 - 2


class BadValue(argparse.ArgumentTypeError):
    """A refused flag or environment value (argparse prints it as one line and exits 2)."""


def _shown(text: str) -> str:
    return repr(text[:60])


def image_tag(text: str) -> str:
    """REPO:TAG as Docker accepts it (lower-case repository path, explicit tag)."""
    if not _TAG.fullmatch(text):
        raise BadValue(f"{_shown(text)} is not an image tag: write REPOSITORY:TAG, e.g. grpo-deploy/cpu:mine "
                       "(lower-case letters, digits, . _ - and / in the repository; no spaces, $ or ..)")
    return text


def run_id(text: str) -> int:
    """A non-root UID or GID: 1 to 2147483646."""
    if not re.fullmatch(r"[0-9]{1,10}", text) or not 1 <= int(text) <= MAX_ID:
        raise BadValue(f"{_shown(text)} is not a non-root id: give a number from 1 to {MAX_ID} (0 is root, and the run "
                       "user must not be root)")
    return int(text)


def checked_path(text: str) -> str:
    """A folder or file path: no control characters, no leading '-', no '..' part, no '$' or backquote."""
    problem = ("empty" if not text else "a control character (newline, tab ...)" if CONTROL.search(text)
               else "a leading '-' (it reads as an option)" if text.startswith("-")
               else "a '..' part" if ".." in text.split("/")
               else "'$' or a backquote" if "$" in text or "`" in text
               else "over 4096 characters" if len(text) > 4096 else None)
    if problem:
        raise BadValue(f"{_shown(text)} is not a usable path: it has {problem}; give a plain absolute or relative "
                       "path")
    return text


def base_suite(text: str) -> str:
    """A suite `images base` knows how to debootstrap (recipes.BASE_SUITES)."""
    from grpo_deploy.image_build.recipes import BASE_SUITES

    if text not in BASE_SUITES:
        raise BadValue(f"{_shown(text)} is not a base suite: give one of {', '.join(sorted(BASE_SUITES))}")
    return text


def base_arch(text: str) -> str:
    """An architecture the kit builds images for (image_tags.ARCHES: Docker's names)."""
    from grpo_deploy.image_build.tags import ARCHES

    if text not in ARCHES:
        raise BadValue(f"{_shown(text)} is not an architecture: give one of {', '.join(ARCHES)} (Docker's names; "
                       "x86_64 is amd64, aarch64 is arm64)")
    return text


def mirror_url(text: str) -> str:
    """An http(s):// or file:// Debian mirror URL without spaces, quotes or '$'."""
    if not _URL.fullmatch(text) or ".." in text.split("/"):
        raise BadValue(f"{_shown(text)} is not a mirror URL: give http://HOST/PATH, https://... or file:///PATH "
                       "(no spaces, quotes, '$' or '..')")
    return text
