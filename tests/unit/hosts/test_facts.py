"""Tests of grpo_deploy.hosts.local_facts (read-only probes of this machine) and of the free-space fact every host is
read by (grpo_deploy.hosts.facts)."""

import shutil

from grpo_deploy.hosts import facts as host_facts
from grpo_deploy.hosts import local_facts
from grpo_deploy.hosts.connect import LocalHost


def test_free_space_measures_the_nearest_existing_folder(tmp_path):
    """df through the connector (real df on this machine): a target that does not exist yet is measured at its
    nearest existing parent, and that folder is named (not the filesystem's mount point)."""
    (tmp_path / "a").mkdir()
    d = host_facts.free_space(LocalHost(), str(tmp_path / "a" / "not" / "yet"))
    assert d.path == str(tmp_path / "a")
    assert abs(d.free_bytes - shutil.disk_usage(tmp_path).free) < 64 * 1024**2
    assert host_facts.free_space(LocalHost(), str(tmp_path)).path == str(tmp_path)


def test_netrc_lookup(tmp_path):
    p = tmp_path / "netrc"
    p.write_text("machine api.wandb.ai login u password p\n")
    p.chmod(0o600)
    assert local_facts.netrc_has("api.wandb.ai", str(p)) and not local_facts.netrc_has("other", str(p))
    assert not local_facts.netrc_has("api.wandb.ai", str(tmp_path / "missing"))
