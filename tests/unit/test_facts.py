"""Tests of grpo_deploy.facts (read-only probes)."""

import shutil

from grpo_deploy import facts


def test_disk_free_uses_nearest_existing_parent(tmp_path):
    d = facts.disk_free(str(tmp_path / "not" / "yet"))
    assert d.path == str(tmp_path)
    assert abs(d.free_bytes - shutil.disk_usage(tmp_path).free) < 64 * 1024**2


def test_netrc_lookup(tmp_path):
    p = tmp_path / "netrc"
    p.write_text("machine api.wandb.ai login u password p\n")
    p.chmod(0o600)
    assert facts.netrc_has("api.wandb.ai", str(p)) and not facts.netrc_has("other", str(p))
    assert not facts.netrc_has("api.wandb.ai", str(tmp_path / "missing"))
