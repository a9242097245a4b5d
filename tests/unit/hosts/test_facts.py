"""Tests of grpo_deploy.hosts.facts: the free-space fact every host is read by."""

import shutil

from grpo_deploy.hosts import facts as host_facts
from grpo_deploy.hosts.connect import LocalHost


def test_free_space_measures_the_nearest_existing_folder(tmp_path):
    """df through the connector (real df on this machine): a target that does not exist yet is measured at its
    nearest existing parent, and that folder is named (not the filesystem's mount point)."""
    (tmp_path / "a").mkdir()
    d = host_facts.free_space(LocalHost(), str(tmp_path / "a" / "not" / "yet"))
    assert d.path == str(tmp_path / "a")
    assert abs(d.free_bytes - shutil.disk_usage(tmp_path).free) < 64 * 1024**2
    assert host_facts.free_space(LocalHost(), str(tmp_path)).path == str(tmp_path)
