"""grpo_deploy.image_build.base: the mirror comes from this host's apt sources (both formats) for the suite asked;
images/base.sh's arguments per suite; the shipped Ubuntu archive key is the pinned one."""

from __future__ import annotations

import hashlib
from pathlib import Path

from grpo_deploy.image_build import base, recipes

REPO = Path(__file__).resolve().parents[3]


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


def test_host_mirrors_are_read_for_the_suite_asked(tmp_path: Path):
    (tmp_path / "s.list").write_text("deb http://m/debian bookworm main\ndeb http://u/ubuntu noble main\n"
                                     "deb http://u/ubuntu noble-security main\n")
    assert base.host_mirrors((tmp_path / "s.list",), suite="noble") == ("http://u/ubuntu", "http://u/ubuntu")
    assert base.host_mirrors((tmp_path / "s.list",), suite="bookworm") == ("http://m/debian", None)
    assert base.host_mirrors((tmp_path / "s.list",), suite="jammy") == (None, None)


def test_bookworm_script_args_are_what_base_sh_took_before(tmp_path: Path):
    bookworm = recipes.BASE_SUITES["bookworm"]
    rootfs = tmp_path / "r"
    assert base.script_args(bookworm, tmp_path, rootfs, None, None) == [
        "--suite", "bookworm", "--components", "main", str(rootfs)]
    assert base.script_args(bookworm, tmp_path, rootfs, "http://m/debian", "http://s/debian-security")[-3:] == [
        str(rootfs), "http://m/debian", "http://s/debian-security"]


def test_noble_passes_the_shipped_keyring_the_generic_script_and_no_mirror(tmp_path: Path):
    """No mirror argument: debootstrap's own default for the suite (the kit names no archive host); the signature is
    checked with the shipped key, never skipped."""
    noble = recipes.BASE_SUITES["noble"]
    args = base.script_args(noble, tmp_path, tmp_path / "r", None, None)
    assert args == ["--suite", "noble", "--components", "main,universe", "--keyring",
                    str(tmp_path / "keyrings" / "ubuntu-archive-2018.gpg"), "--script", "gutsy",
                    "--pockets", "updates security", str(tmp_path / "r")]
    assert noble.tag == "grpo-deploy/ubuntu:noble"
    script = (REPO / "images" / "base.sh").read_text()
    assert "--no-check-gpg" not in script and "http" not in script


def _packets(data: bytes):
    """(tag, body) of each OpenPGP packet (RFC 4880 section 4.2: old and new formats)."""
    i = 0
    while i < len(data):
        head = data[i]
        assert head & 0x80, f"not an OpenPGP packet at byte {i}"
        if head & 0x40:  # new format
            tag, first = head & 0x3F, data[i + 1]
            if first < 192:
                length, i = first, i + 2
            elif first < 224:
                length, i = ((first - 192) << 8) + data[i + 2] + 192, i + 3
            else:
                assert first == 255, "partial body lengths are not used in keyrings"
                length, i = int.from_bytes(data[i + 2:i + 6], "big"), i + 6
        else:
            tag, kind = (head >> 2) & 0x0F, head & 3
            size = {0: 1, 1: 2, 2: 4}[kind]
            length, i = int.from_bytes(data[i + 1:i + 1 + size], "big"), i + 1 + size
        yield tag, data[i:i + length]
        i += length


def test_the_shipped_ubuntu_keyring_holds_exactly_the_pinned_archive_key():
    """The v4 fingerprint (SHA-1 of 0x99, the 2-byte length and the public-key packet) of the one primary key in
    images/keyrings/ubuntu-archive-2018.gpg is the one BASE_SUITES pins: the key that signs noble's Release files."""
    noble = recipes.BASE_SUITES["noble"]
    data = (REPO / "images" / noble.keyring).read_bytes()
    keys = [body for tag, body in _packets(data) if tag == 6]
    assert len(keys) == 1 and keys[0][0] == 4, "one v4 primary key"
    fingerprint = hashlib.sha1(b"\x99" + len(keys[0]).to_bytes(2, "big") + keys[0]).hexdigest().upper()
    assert fingerprint == noble.keyring_fingerprint == "F6ECB3762474EDA9D21B7022871920D1991BC93C"
    assert not [tag for tag, _ in _packets(data) if tag in (5, 7)], "no secret key material"


def test_another_architecture_passes_arch_to_debootstrap_and_tags_it(tmp_path: Path):
    args = base.script_args(recipes.BASE_SUITES["bookworm"], tmp_path, tmp_path / "r", None, None, "arm64")
    assert args[args.index("--arch") + 1] == "arm64"
    assert "--arch" not in base.script_args(recipes.BASE_SUITES["bookworm"], tmp_path, tmp_path / "r", None, None)
    assert recipes.base_tag(arch="arm64") == "grpo-deploy/debian:bookworm-arm64"
    assert recipes.known_base("grpo-deploy/debian:bookworm-arm64") == ("bookworm", "arm64")
    assert recipes.known_base(recipes.BASE_TAG) == ("bookworm", None)
    assert recipes.known_base("grpo-deploy/debian:trixie") is None


def test_a_foreign_architecture_needs_an_enabled_qemu_handler(tmp_path: Path):
    assert base.foreign_arch_problem(None, "x86_64", tmp_path) is None
    assert base.foreign_arch_problem("amd64", "x86_64", tmp_path) is None  # the host's own
    assert base.foreign_arch_problem("arm64", "aarch64", tmp_path) is None
    missing = base.foreign_arch_problem("arm64", "x86_64", tmp_path)
    assert "qemu-aarch64" in missing and "qemu-user-static binfmt-support" in missing
    (tmp_path / "qemu-aarch64").write_text("disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n")
    assert "disabled" in base.foreign_arch_problem("arm64", "x86_64", tmp_path)
    (tmp_path / "qemu-aarch64").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n")
    assert base.foreign_arch_problem("arm64", "x86_64", tmp_path) is None


def test_the_arm64_cuda_recipes_stand_on_the_arm64_base():
    for role in ("server", "trainer"):
        recipe = recipes.RECIPES[f"cuda-{role}-arm64"]
        assert recipe.base == recipes.base_tag(arch="arm64") and recipe.platform.arch == "arm64"
        assert recipe.build_args["ARCH"] == "arm64" and recipe.tag.endswith("-cu130-arm64")
    assert recipes.RECIPES["cuda-server-amd64"].base == recipes.BASE_TAG


def test_is_foreign_compares_dockers_name_with_the_machine():
    assert base.is_foreign("arm64", "x86_64") and base.is_foreign("amd64", "aarch64")
    assert not base.is_foreign("amd64", "x86_64") and not base.is_foreign(None, "x86_64")
