"""Tests of grpo_deploy.common.dirlock: one writer holds a directory's lock at a time; a second is refused as Busy
after its deadline with one line, and the lock is free again when the first is done."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from grpo_deploy.common import dirlock


def test_the_lock_is_held_for_the_block_and_leaves_nothing_behind(tmp_path):
    with dirlock.locked(tmp_path, "a render"):
        assert list(tmp_path.iterdir()) == []
    with dirlock.locked(tmp_path, "a render", wait_s=0):  # free again
        pass


def test_a_second_process_is_refused_after_its_deadline(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom grpo_deploy.common import dirlock\n"
                               f"with dirlock.locked({str(tmp_path)!r}, 'x'):\n    print('held', flush=True)\n"
                               "    time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        start = time.monotonic()
        with pytest.raises(dirlock.Busy) as exc:
            with dirlock.locked(tmp_path, "checkpoints", wait_s=0.3):
                pass
        assert 0.25 <= time.monotonic() - start < 5
        assert str(tmp_path) in str(exc.value) and "writing checkpoints" in str(exc.value)
        assert "\n" not in str(exc.value)
    finally:
        holder.kill()
        holder.wait()
    with dirlock.locked(tmp_path, "checkpoints", wait_s=5):  # the lock went with the process
        pass


def test_a_missing_directory_is_an_error_not_a_lock(tmp_path):
    with pytest.raises(FileNotFoundError):
        with dirlock.locked(tmp_path / "absent", "a render"):
            pass
