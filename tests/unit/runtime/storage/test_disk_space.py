"""Whether the next checkpoint fits (runtime/storage/disk_space.py): the verdict against the estimate, the newest
checkpoint's real size and the margin; the free space of a path not made yet; and the verdict on a real small
filesystem (a tmpfs, mounted as root as CI runs)."""

from __future__ import annotations

from grpo_deploy.runtime.storage.disk_space import DiskWatchdogConfig, free_bytes, judge
from tests.unit.runtime.as_root import small_tmpfs
from tests.unit.runtime.storage.test_checkpoints import trl_checkpoint

MB = 10**6


def test_the_estimate_counts_when_no_checkpoint_exists(tmp_path):
    config = DiskWatchdogConfig(checkpoint_bytes=5 * MB, margin_bytes=1 * MB)
    assert judge(str(tmp_path), config, free=lambda _: 6 * MB).fits
    verdict = judge(str(tmp_path), config, free=lambda _: 6 * MB - 1)
    assert not verdict.fits and verdict.need_bytes == 6 * MB and "no checkpoint yet" in verdict.message


def test_the_newest_checkpoint_counts_when_larger_than_the_estimate(tmp_path):
    newest = trl_checkpoint(tmp_path, 10)  # ~3 kB on disk
    size = sum(f.stat().st_size for f in newest.iterdir())
    verdict = judge(str(tmp_path), DiskWatchdogConfig(checkpoint_bytes=100, margin_bytes=0), free=lambda _: size - 1)
    assert not verdict.fits and verdict.need_bytes == size
    assert f"the newest complete checkpoint ({newest}) is kept" in verdict.message


def test_free_bytes_of_a_path_not_made_yet(tmp_path):
    assert free_bytes(str(tmp_path / "not" / "yet")) == free_bytes(str(tmp_path))


def test_on_a_real_small_filesystem(tmp_path):
    with small_tmpfs(tmp_path, "4m") as mnt:
        ckpt = trl_checkpoint(mnt, 10)
        (ckpt / "optimizer.pt").write_bytes(b"o" * MB)  # a 1 MB checkpoint on a 4 MB filesystem
        free = free_bytes(str(mnt))
        assert 2 * MB < free <= 4 * 2**20 - MB  # 4 MiB less the checkpoint
        assert judge(str(mnt), DiskWatchdogConfig(margin_bytes=MB)).fits
        verdict = judge(str(mnt), DiskWatchdogConfig(margin_bytes=free - MB + 1))  # 1 MB checkpoint + margin > free
        assert not verdict.fits and verdict.free_bytes == free and verdict.need_bytes > free
