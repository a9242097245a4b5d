"""Loading a spec: YAML text or a file -> a validated LoadedSpec, or a SpecError listing every problem at its
file:line (schema errors with "did you mean", credentials planted in the file, then the cross-field rules)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from grpo_deploy.common.shown import did_you_mean
from grpo_deploy.common.values import SECRET_WORDS, describe_error, error_location
from grpo_deploy.spec.rules import check_consistency
from grpo_deploy.spec.schema import DeploymentSpec, LoadedSpec, Problem, SpecError, key_str
from grpo_deploy.spec.yamlpos import Located, YamlSyntaxError, load_file, load_text, shown_path

# Environment variables whose values are credentials: a spec holding one of their values is refused.
SECRET_ENV_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD")
SECRET_ENV_WORDS = SECRET_WORDS  # the kit's one list of credential words (runtime.values)
SECRET_MIN_LEN = 6  # a planted value this short is still caught; shorter ones match too much ordinary text


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The spec model that holds the last key of *loc* (for "did you mean" on an unknown key)."""
    cls: Any = DeploymentSpec
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or part not in cls.model_fields:
            return None
        cls = inner_model(cls.model_fields[part].annotation)
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, list, dict) or type(annotation).__name__ == "UnionType":
        for arg in get_args(annotation):
            found = inner_model(arg)
            if found is not None:
                return found
    return None


def _pydantic_problems(exc: ValidationError, doc: Located) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc, msg = error_location(err)
        if err["type"] == "extra_forbidden":
            model = _model_at(loc)
            known = sorted(model.model_fields) if model else []
            msg = "unknown key" + (did_you_mean(str(loc[-1]), known) or (f"; allowed: {', '.join(known)}"
                                                                         if known else ""))
        else:
            msg = describe_error(err) if msg is None else msg
        where, key = doc.where(loc), key_str(loc)
        last = problems[-1] if problems else None
        if last is not None and (last.where, last.key) == (where, key) and msg not in last.message:
            # one line a key: a value that is none of a union's kinds (a number or 'auto') says each, joined
            problems[-1] = Problem(where, key, f"{last.message}; or {msg}")
        else:
            problems.append(Problem(where, key, msg))
    return problems


def secret_values(environ: dict[str, str] | None = None) -> dict[str, str]:
    """{value: variable name} of the caller's credentials (known names, and names that say TOKEN, SECRET ...)."""
    environ = os.environ if environ is None else environ
    return {value: name for name, value in environ.items() if len(value) >= SECRET_MIN_LEN
            and (name in SECRET_ENV_NAMES or any(w in name.upper() for w in SECRET_ENV_WORDS))}


def _secret_problems(doc: Located, secrets: dict[str, str]) -> list[Problem]:
    """A spec must not hold a credential: any string in it that contains the value of one is refused."""
    problems = []

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                # A key that holds a secret is shown by its place, never by its text.
                shown = "<a key>" if isinstance(key, str) and any(s in key for s in secrets) else key
                walk(key, path + ("<a key>",))
                walk(value, path + (shown,))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, path + (i,))
        elif isinstance(node, (str, int, float)):
            # A number holds a secret too: an all-digit credential written unquoted is a number to YAML.
            text = node if isinstance(node, str) else "" if isinstance(node, bool) else str(node)
            for value, name in secrets.items():
                if value in text:
                    problems.append(Problem(doc.where(path), key_str(path),
                                            f"holds the value of ${name} from your environment: a spec is a plain "
                                            "file and its values reach rendered files; remove it (credentials are "
                                            "passed to the containers from the environment at start)"))
                    return

    if secrets:
        walk(doc.data, ())
    return problems


def parse(doc: Located, environ: dict[str, str] | None = None) -> LoadedSpec:
    """Validate a located YAML document into a spec; raise SpecError listing every problem."""
    if not isinstance(doc.data, dict):
        raise SpecError([Problem(doc.where(()), "<top>", "the spec must be a YAML mapping")])
    if doc.data and not any(key in DeploymentSpec.model_fields for key in doc.data):
        # Not a spec at all (a wrong -f, a link to another file): say so without quoting any of it.
        raise SpecError([Problem(doc.where(()), "<top>", "this is not a deployment spec (none of its "
                                 f"{len(doc.data)} top-level key(s) is one a spec has: "
                                 f"{', '.join(DeploymentSpec.model_fields)}); check -f, or write one with "
                                 "`grpo-deploy init`")])
    secrets = _secret_problems(doc, secret_values(environ))
    if secrets:
        raise SpecError(secrets)
    try:
        spec = DeploymentSpec.model_validate(doc.data)
    except ValidationError as exc:
        raise SpecError(_pydantic_problems(exc, doc)) from None
    loaded = LoadedSpec(spec, doc)
    problems = check_consistency(loaded)
    if problems:
        raise SpecError(problems)
    return loaded


def load(path: str | Path) -> LoadedSpec:
    try:
        doc = load_file(Path(path))
    except YamlSyntaxError as exc:
        raise SpecError([Problem(shown_path(path), "<file>", str(exc))]) from None
    return parse(doc)


def loads(text: str, source: str = "<spec>") -> LoadedSpec:
    try:
        doc = load_text(text, source)
    except YamlSyntaxError as exc:
        raise SpecError([Problem(source, "<yaml>", str(exc))]) from None
    return parse(doc)

