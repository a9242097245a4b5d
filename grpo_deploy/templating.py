"""The text every renderer shares: the Jinja templates (package data) with their control-character guard, the env
file rule compose and Kubernetes both read, YAML dumping, and the one error a renderer raises. Imports nothing of
the kit above runtime/, so render.py and every engine module may use it."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import jinja2
import yaml

from grpo_deploy.common.values import CONTROL, ENV_VALUE_FORBIDDEN


class RenderError(RuntimeError):
    """A value reached a renderer that its format cannot hold (the spec types should have refused it first)."""


_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _finalize(value: Any) -> Any:
    """Every `{{ value }}` in a template: never a control character (a newline would start a new line, i.e. a new
    variable or argument)."""
    if isinstance(value, str) and CONTROL.search(value):
        raise RenderError(f"refusing to render {value!r}: it holds a control character")
    return "" if value is None else value


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("grpo_deploy", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
    )


def template(name: str, **context: Any) -> str:
    """Template *name* (grpo_deploy/templates) filled with *context*; an env file is checked as one."""
    text = _env().get_template(name).render(**context)
    if name.endswith(".env.j2"):
        check_env_file(text, name)
    return text


def check_env_file(text: str, name: str) -> str:
    """An env file read by compose and by Kubernetes must mean the same to both: KEY=VALUE lines whose values hold
    nothing either reader treats specially ('$', quotes, '#', backslash)."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _ENV_KEY.fullmatch(key) or ENV_VALUE_FORBIDDEN & set(value):
            raise RenderError(f"{name}:{number}: refusing to render {line!r}: not a plain KEY=VALUE line")
    return text


def dump_yaml(header: str, data: dict[str, Any]) -> str:
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120)
