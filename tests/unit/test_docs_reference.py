"""The documentation's generated reference (grpo_deploy/docs_reference.py): every spec key, profile setting and verb
is on its page; --check finds a stale page and writes nothing."""

from __future__ import annotations

from grpo_deploy import docs_reference
from grpo_deploy.settings import SECTIONS
from grpo_deploy.spec import profiles
from grpo_deploy.spec.schema import DeploymentSpec


def test_spec_page_has_every_top_level_key_and_every_override_key():
    page = docs_reference.spec_page()
    for name, info in DeploymentSpec.model_fields.items():
        assert f"| `{info.alias or name}` |" in page, name
    for section, model in SECTIONS.items():
        assert f"### `overrides.{section}`" in page
        for name, info in model.model_fields.items():
            assert f"| `{info.alias or name}` |" in page, (section, name)
    assert "grpo-deploy deployment spec (written by `grpo-deploy init" in page  # init's own text, comments and all


def test_profiles_page_has_every_setting_with_its_why():
    page = docs_reference.profiles_page()
    for name in profiles.names():
        profile = profiles.load(name)
        assert f"## `{name}`" in page
        for section, settings in profile.settings.items():
            for key, setting in settings.items():
                assert f"| `{section}.{key}` |" in page
                assert docs_reference._cell(setting.why) in page


def test_cli_page_has_every_verb_help_at_a_fixed_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    page = docs_reference.cli_page()
    for verb in ("init", "render", "plan", "preflight", "up", "status", "down", "logs", "checkpoints", "diagnose",
                 "tune", "images", "k8s render", "k8s check"):
        assert f"## `grpo-deploy {verb}`" in page, verb
    assert page == docs_reference.cli_page()
    monkeypatch.delenv("COLUMNS")
    assert page == docs_reference.cli_page()  # the terminal's width does not reach the page


def test_preflight_page_has_every_registered_check_in_order_with_when_up_runs_it():
    from grpo_deploy.preflight.registry import CHECKS, ORDER

    page = docs_reference.preflight_page()
    rows = [line for line in page.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    assert [row.split("|")[2].strip().strip("`") for row in rows] == [c.name for c in CHECKS]
    assert [c.name for c in CHECKS] == [n for n in ORDER if n in {c.name for c in CHECKS}]
    shared = next(row for row in rows if "`shared-volume`" in row)
    assert "after the images are on their hosts" in shared and "before shipping, and again after it" in page


def test_cell_keeps_a_table_row_on_one_line():
    assert docs_reference._cell("a |\n b") == "a \\| b"


def test_check_finds_a_stale_page_and_writes_nothing(tmp_path, capsys):
    assert docs_reference.main(["--out", str(tmp_path), "--check"]) == 1
    assert not list(tmp_path.iterdir())
    assert docs_reference.main(["--out", str(tmp_path)]) == 0
    assert docs_reference.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "spec.md").write_text("old", encoding="utf-8")
    assert docs_reference.main(["--out", str(tmp_path), "--check"]) == 1
    assert "spec.md differs from the generator" in capsys.readouterr().err
