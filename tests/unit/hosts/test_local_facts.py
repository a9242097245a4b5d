"""Tests of grpo_deploy.hosts.local_facts: read-only facts of this machine (the logger's credentials in the
environment and in ~/.netrc)."""

from grpo_deploy.hosts import local_facts


def test_netrc_lookup(tmp_path):
    p = tmp_path / "netrc"
    p.write_text("machine api.wandb.ai login u password p\n")
    p.chmod(0o600)
    assert local_facts.netrc_has("api.wandb.ai", str(p)) and not local_facts.netrc_has("other", str(p))
    assert not local_facts.netrc_has("api.wandb.ai", str(tmp_path / "missing"))


def test_env_set_reads_the_given_environment_or_this_process_s(monkeypatch):
    assert local_facts.env_set("WANDB_API_KEY", {"WANDB_API_KEY": "k"})
    assert not local_facts.env_set("WANDB_API_KEY", {"WANDB_API_KEY": ""}) and not local_facts.env_set("X", {})
    monkeypatch.setenv("GRPO_TEST_SET", "1")
    assert local_facts.env_set("GRPO_TEST_SET") and not local_facts.env_set("GRPO_TEST_SET", {})
