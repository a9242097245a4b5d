"""The `bench` verb: measurements a user runs where the work runs (`bench trainer`: the trainer's forward/backward)."""

from __future__ import annotations

import argparse

from grpo_deploy.runtime.bench import trainer as bench_trainer


def add_bench_parser(subparsers) -> None:
    """Register `bench trainer` on the CLI's verb subparsers; its options are the runtime module's own."""
    bench = subparsers.add_parser(
        "bench", help="measure where the work runs (trainer: tokens/s, memory, MFU)",
        description="Benchmarks that run where the work runs: inside a trainer image, on its GPU.")
    what = bench.add_subparsers(dest="bench", metavar="WHAT", required=True)
    trainer = what.add_parser(
        "trainer", help="TRL's packed GRPO fwd/bwd: packing off/on x checkpointing, token budget, attention paths",
        description=bench_trainer.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_trainer.add_arguments(trainer)
    trainer.set_defaults(fn=bench_trainer.run)
