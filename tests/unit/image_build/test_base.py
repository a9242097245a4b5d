"""grpo_deploy.image_build.base: the Debian mirror comes from this host's apt sources (both formats)."""

from __future__ import annotations

from pathlib import Path

from grpo_deploy.image_build import base


def test_one_line_sources_with_options_and_comments():
    text = ("# deb http://old/ bookworm main\ndeb-src http://src/ bookworm main\n"
            "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main  # trailing\n"
            "deb http://security.example/debian-security bookworm-security main\n")
    assert base.parse_sources("sources.list", text) == [("http://mirror.example/debian", "bookworm"),
                                                        ("http://security.example/debian-security",
                                                         "bookworm-security")]


def test_deb822_sources_skip_disabled_and_source_stanzas():
    text = ("Types: deb\nURIs: http://m1/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
            "Types: deb-src\nURIs: http://src/debian\nSuites: bookworm\n\n"
            "Types: deb\nEnabled: no\nURIs: http://off/debian\nSuites: bookworm\n\n"
            "Types: deb\nURIs: http://sec/debian-security\nSuites: bookworm-security\n")
    assert base.parse_sources("debian.sources", text) == [("http://m1/debian", "bookworm"),
                                                          ("http://m1/debian", "bookworm-updates"),
                                                          ("http://sec/debian-security", "bookworm-security")]


def test_host_mirrors_reads_a_folder_and_a_file_and_says_none_when_absent(tmp_path: Path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.sources").write_text("Types: deb\nURIs: http://m/debian\nSuites: bookworm\n")
    (tmp_path / "d" / "ignored.txt").write_text("deb http://no/ bookworm main\n")
    assert base.host_mirrors((tmp_path / "sources.list", tmp_path / "d")) == ("http://m/debian", None)
    assert base.host_mirrors((tmp_path / "none",)) == (None, None)
