"""Tests of grpo_deploy.harness_memory: nvidia-smi's compute apps summed per process, and nothing without nvidia-smi."""

from __future__ import annotations

import os

from grpo_deploy import harness_memory


def test_nvidia_smi_compute_apps_are_summed_per_pid_and_junk_is_skipped():
    text = "123, 4000\n123, 96\n77, 512\n[N/A], 3\nx\n"
    assert harness_memory.parse_compute_apps(text) == {123: 4096, 77: 512}


def test_without_nvidia_smi_no_memory_is_read():
    assert harness_memory.gpu_use_by_pid(None) == {} and harness_memory.gpu_use_by_pid("") == {}
    assert harness_memory.gpu_use_by_pid("/nonexistent/nvidia-smi") == {}
    assert harness_memory.parse_compute_apps("") == {} and harness_memory.parse_compute_apps("-1, 5\n1, -5\n") == {}


def test_a_process_session_is_read_from_proc():
    assert harness_memory._session_of(os.getpid()) == os.getsid(0)
    assert harness_memory._session_of(2**22 + 1) is None  # above pid_max: gone
