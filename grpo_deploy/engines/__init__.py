"""The training engines: the registry (ENGINES by name, their names, every role any engine has, the default engine)
over the interface (grpo_deploy.engines.base) and one module per engine with the same methods (trl_async, verl).
Adding an engine adds a module and registers its instance here; an engine declares its own what-if knobs, restart
words and cluster needs. Outside engines/ it still needs its bring-up (grpo_deploy.deploy.bringup: a module and a
row of BRINGUP), its diagnosis (grpo_deploy.diagnose*, reached through Engine.diagnose), its image and its
profiles' reference figures; nothing else names an engine (tests/static/test_engine_boundary.py)."""

from __future__ import annotations

from grpo_deploy.engines.base import Engine, Unsupported
from grpo_deploy.engines.trl_async import TRL_ASYNC
from grpo_deploy.engines.verl import VERL

ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    """Make *engine* known by its name (the spec's `engine:` is checked against ENGINES when it is read)."""
    ENGINES[engine.name] = engine
    return engine


for _engine in (TRL_ASYNC, VERL):
    register(_engine)
ENGINE_NAMES = tuple(ENGINES)
ALL_ROLES = tuple(dict.fromkeys(role for e in ENGINES.values() for role in e.roles))
"""Every role of the shipped engines, each once, in the order of the engines and their roles."""
DEFAULT_ENGINE = TRL_ASYNC.name
"""What `init` writes when no --engine is given."""

__all__ = ["ALL_ROLES", "DEFAULT_ENGINE", "ENGINES", "ENGINE_NAMES", "TRL_ASYNC", "VERL", "Engine", "Unsupported",
           "register"]
