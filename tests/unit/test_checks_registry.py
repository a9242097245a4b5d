"""Tests of grpo_deploy.checks.registry: the order checks run in, and `up`'s phases taken from what each check needs."""

from __future__ import annotations

from grpo_deploy import checks


def test_checks_run_in_the_stated_order():
    assert checks.names() == list(checks.registry.ORDER)


def test_up_picks_its_phases_from_what_each_check_needs():
    assert {c.name for c in checks.CHECKS if c.needs_images} == {"shared-volume"}
    assert checks.before_shipping() == [c.name for c in checks.CHECKS if not c.needs_images]
    assert checks.after_shipping() == ["images", "shared-volume"]  # images re-read once they are on the hosts
