"""Preflight, as it was imported before the checks moved to grpo_deploy.checks: the same public names, re-exported."""

from __future__ import annotations

from .checks import (  # noqa: F401  (re-exported)
    CHECKS,
    EXIT_COULD_NOT_RUN,
    EXIT_FAILED,
    EXIT_OK,
    FAIL,
    OK,
    SKIP,
    TRL_VLLM_GATE,
    WARN,
    Check,
    Context,
    Result,
    check,
    checkpoint_free_space,
    checkpoint_headroom,
    exit_code,
    headroom_text,
    run_checks,
    table_text,
    to_json,
)
from .checks.host import CLOCK_TOLERANCE_S, COMPAT_ENV, DATACENTER_GPUS, MIN_DRIVER, driver_verdict  # noqa: F401
from .checks.images import image_on as _image_on  # noqa: F401
from .checks.session import image_roles as _image_roles  # noqa: F401
from .checks.session import measured_free_space as _measured_free_space  # noqa: F401
