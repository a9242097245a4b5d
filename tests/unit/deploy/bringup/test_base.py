"""Tests of grpo_deploy.deploy.bringup.base: the main role's exit read from its container (a run still going, an
exit code, a kill that supervision restarts from)."""

import pytest

from grpo_deploy.deploy.bringup.base import main_exit
from grpo_deploy.deploy.supervise import KILLED, RoleDied


def test_a_running_container_has_no_exit_yet():
    assert main_exit({"state": "running", "exit_code": 0}, 5) is None
    assert main_exit({"state": "restarting", "exit_code": 1}, 5) is None


def test_a_stopped_container_gives_its_exit_code():
    assert main_exit({"state": "exited", "exit_code": 0}, 5) == 0
    assert main_exit({"state": "dead", "exit_code": "3"}, 5) == 3


def test_a_killed_main_role_is_a_role_death_at_its_last_step():
    with pytest.raises(RoleDied) as info:
        main_exit({"state": "exited", "exit_code": KILLED}, 7)
    assert (info.value.role, info.value.exit_code, info.value.step) == ("trainer", KILLED, 7)
