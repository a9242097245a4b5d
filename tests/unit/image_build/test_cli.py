"""The `images` verb's door: hostile flag and environment values are refused in one line, exit 2, nothing run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_deploy import cli

REPO = Path(__file__).resolve().parents[3]
HOSTILE = ["", "a\nb", "$HOME", "-rf", "..", "x/../y", "a`id`"]


def _main(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("value", [*HOSTILE, "0", "-1", "1.5", "99999999999", "2147483647", "１２"])
@pytest.mark.parametrize("flag", ["--uid", "--gid"])
def test_ids_refused_in_one_line_exit_2(flag: str, value: str, capsys):
    code, err = _main(["images", "build", "cpu", f"{flag}={value}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "non-root id" in err and "Traceback" not in err


@pytest.mark.parametrize("value", [*HOSTILE, "grpo-deploy/cpu", "Grpo/cpu:1", "grpo/cpu:", "grpo//cpu:1",
                                   "grpo-deploy/../cpu:1", "grpo/cpu:1\n", "grpo/cpu:-x", "grpo/cpu:$x"])
def test_tags_refused_in_one_line_exit_2(value: str, capsys):
    code, err = _main(["images", "build", "cpu", f"--tag={value}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "is not an image tag" in err


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("argv", [["images", "wheelhouse", "cpu", "--dir"], ["images", "build", "cpu", "--wheelhouse"],
                                  ["images", "lock", "cpu", "--find-links"]])
def test_folders_refused_in_one_line_exit_2(argv: list[str], value: str, capsys):
    code, err = _main([*argv[:-1], f"{argv[-1]}={value}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "not a usable path" in err


@pytest.mark.parametrize("value", ["ftp://h/debian", "http://h/debian\n", "http://h/$x", "http://h/a b", "http://h/../x",
                                   "-http://h"])
def test_mirrors_refused_in_one_line_exit_2(value: str, capsys):
    code, err = _main(["images", "base", f"--mirror={value}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "not a mirror URL" in err


def test_unknown_recipe_refused_exit_2(capsys):
    code, err = _main(["images", "build", "trainer-amd64"], capsys)
    assert code == 2 and "invalid choice" in err and err.count("\n") == 1


def test_a_hostile_build_dir_from_the_command_line_is_one_line_exit_2_and_nothing_is_made(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "grpo_deploy.cli", "images", "wheelhouse", "cpu"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "GRPO_BUILD_DIR": "x/../../etc"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "GRPO_BUILD_DIR" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_of_every_images_command_exits_0(capsys):
    for command in ("base", "wheelhouse", "build", "verify", "lock", "lint", "list"):
        with pytest.raises(SystemExit) as exc:
            cli.main(["images", command, "--help"])
        assert exc.value.code == 0
        assert "usage: grpo-deploy images " + command in capsys.readouterr().out


def test_list_prints_the_table(capsys):
    assert cli.main(["images", "list"]) == 0
    out = capsys.readouterr().out
    assert "cpu" in out and "grpo-deploy/cpu:" in out and "trainer-arm64" in out


@pytest.mark.parametrize("value", [*HOSTILE, "noble\n", "jammy", "Noble", "$suite", "../noble", "-noble"])
def test_suites_refused_in_one_line_exit_2(value: str, capsys):
    code, err = _main(["images", "base", f"--suite={value}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "is not a base suite: give one of bookworm, noble" in err


@pytest.mark.parametrize("value", [*HOSTILE, "arm", "aarch64", "x86_64", "ARM64", "arm64\n", "$arch", "../arm64",
                                   "-arm64"])
def test_architectures_refused_in_one_line_exit_2(value: str, capsys):
    code, err = _main(["images", "base", f"--arch={value}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "is not an architecture" in err and "Traceback" not in err


def test_a_tag_with_several_recipes_is_refused_before_any_build(capsys):
    for verb in ("build", "verify"):
        code = cli.main(["images", verb, "cuda-server-amd64", "cuda-trainer-amd64", "--tag=grpo/x:1"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "--tag names one image" in err
