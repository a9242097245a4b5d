"""Tests of grpo_deploy.preflight.registry: the order checks run in, and `up`'s phases taken from what each check
needs."""

from __future__ import annotations

from grpo_deploy import preflight


def test_checks_run_in_the_stated_order():
    assert preflight.names() == list(preflight.registry.ORDER)


def test_up_picks_its_phases_from_what_each_check_needs():
    assert {c.name for c in preflight.CHECKS if c.needs_images} == {"shared-volume", "cluster-reach"}
    assert preflight.before_shipping() == [c.name for c in preflight.CHECKS if not c.needs_images]
    # images re-read once they are on the hosts; the probes between hosts run in the images
    assert preflight.after_shipping() == ["images", "shared-volume", "cluster-reach"]


def test_a_check_decorator_on_anything_but_its_check_is_refused_at_import():
    """@check(name) belongs on check_<name>: one landing on a helper written between it and its check would make
    the helper the check (seen: `reachable` returned (host, facts) tuples and `up` ended in a traceback)."""
    import pytest

    def reached(ctx):
        return []

    with pytest.raises(TypeError, match=r"@check\('clock'\) decorates reached; it belongs on check_clock"):
        preflight.registry.check("clock", "x")(reached)
    assert preflight.names() == list(preflight.registry.ORDER)  # nothing was registered


def test_every_check_answers_with_results_on_this_machine():
    """The whole preflight of the embedded default on this machine's real engine (no images needed): every row is a
    Result and the table prints."""
    from grpo_deploy.spec import new_spec, resolve

    ctx = preflight.Context(resolve.resolve(new_spec.embedded_default()))
    try:
        results = preflight.run_checks(ctx, only=preflight.before_shipping())
    finally:
        ctx.close()
    assert results and all(isinstance(r, preflight.Result) for r in results), [type(r) for r in results]
    assert {r.check for r in results} >= {"reachable", "clock", "docker", "arch", "port", "disk"}
    assert "reachable" in preflight.table_text(results)
