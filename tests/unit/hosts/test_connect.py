"""The connectors' time limits on this machine (grpo_deploy.hosts.connect): a connector's command cap shortens
every command's own limit (what status uses so that a busy engine costs seconds)."""

from __future__ import annotations

import time

from grpo_deploy.hosts.connect import LocalHost


def test_the_cap_shortens_a_commands_own_limit():
    host = LocalHost(command_cap_s=1)
    start = time.monotonic()
    result = host.run(["sleep", "30"], timeout=120)
    assert result.rc == 124 and "within 1 s" in result.err
    assert time.monotonic() - start < 5


def test_without_a_cap_the_commands_own_limit_holds():
    result = LocalHost().run(["sh", "-c", "sleep 1.5; echo done"], timeout=10)
    assert result.ok and result.out.strip() == "done"
