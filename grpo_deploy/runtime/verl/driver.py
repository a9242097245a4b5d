"""verl's trainer (`verl.trainer.main_ppo`) as the head's driver, started while the head's Ray node is still starting:
the driver's own start-up (importing torch, verl and vLLM, composing and validating the Hydra config: ~20 s on 2 cores)
overlaps `ray start` (~10 s) instead of following it. Its one call that needs Ray, `ray.init`, waits for the head's
word on stdin: `go` once Ray is up (and, across hosts, the cluster complete); anything else (stdin closed) ends the
driver before it touches Ray. Everything else is verl's own entry point, unchanged (the same Hydra overrides)."""

from __future__ import annotations

import sys

GO = "go"
"""The head's word on the driver's stdin: Ray is up, join it."""
REFUSED = 4
"""The driver's exit code when the head never said go."""


def hold_ray_init(ray, stream) -> None:
    """Make `ray.init` wait for GO on *stream* (SystemExit(REFUSED) on anything else)."""
    original = ray.init

    def init(*args, **kwargs):
        if stream.readline().strip() != GO:
            print("verl driver: the Ray node did not start: verl not started", file=sys.stderr, flush=True)
            raise SystemExit(REFUSED)
        return original(*args, **kwargs)

    init.__wrapped__ = original
    ray.init = init


def main(argv: list[str] | None = None) -> None:
    import ray

    hold_ray_init(ray, sys.stdin)
    from verl.trainer import main_ppo

    # Hydra reads its overrides from sys.argv; the config is found through the module (pkg://verl.trainer/config)
    sys.argv = [main_ppo.__file__, *(sys.argv[1:] if argv is None else argv)]
    main_ppo.main()


if __name__ == "__main__":
    main()
