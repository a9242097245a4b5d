"""CI rules for the whole suite: with GRPO_NO_SKIPS=1 (set by `make test`) a skipped test fails the run; the arm64
image build starts in the background when selected (tests/image_prebuild.py); each directory's time and each image
build are recorded for .ci/run's phase table (tests/ci_phases.py). The session's fixtures for a real engine: one
client from the kit's own factory, and the cpu and verl-cpu images each built at most once."""

from __future__ import annotations

import os
import sys

import pytest

# TorchInductor's CPU code generation imports setuptools; after another test imported the standard library's
# distutils (Python 3.11 still has it), setuptools' distutils shim asserts and the compile fails. One distutils for the
# whole session: the standard library's. Python 3.12 has none (the GPU machine's): there setuptools' own must serve, and
# the setting would leave vLLM's import of setuptools without any distutils (found by the first harness run on a GPU).
if sys.version_info < (3, 12):
    os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")

from tests import ci_phases, kit_images


@pytest.fixture(scope="session")
def docker_client():
    """The kit's own client factory (grpo_deploy.hosts.docker_api), the same timeouts as the product: no second client
    with other numbers. Raises (a test error, not a skip) when no engine answers: CI starts one."""
    from grpo_deploy.hosts import docker_api

    return docker_api.client()


def _image_of(docker_client, name: str, log_glob: str) -> str:
    """Image *name* built or refreshed the way `up` does it (tests/kit_images.py), at most once a session: a failed
    build is reported in full once, then in one line by each test that needed it; its time is a phase-table row."""
    from grpo_deploy.image_build import places

    return ci_phases.built_once(name, lambda: kit_images.build(docker_client, name),
                                str(places.build_dir() / "logs" / log_glob))


@pytest.fixture(scope="session")
def cpu_image(docker_client):
    """The embedded default's cpu image (debootstrap base + host wheelhouse + --no-index install; only the code layer
    is rebuilt when the kit's code changed)."""
    return _image_of(docker_client, "cpu", "image-cpu*.log")


@pytest.fixture(scope="session")
def verl_image(docker_client, cpu_image):
    """The cpu profile's verl image (verl-cpu: verl, Ray and TransferQueue on the cpu image's dependency image)."""
    return _image_of(docker_client, "verl-cpu", "image-verl*.log")

# In CI (`make test` sets GRPO_NO_SKIPS=1) a skipped test is a failure: what this machine can run, CI runs.
# Tests that need hardware this machine lacks carry @pytest.mark.gpu and are deselected with -m "not gpu".
_SKIPPED: list[str] = []


def pytest_runtest_logreport(report):
    import os

    ci_phases.add_report(report)
    if report.skipped and os.environ.get("GRPO_NO_SKIPS") == "1":
        _SKIPPED.append(report.nodeid)


_NOTES: list[str] = []


def pytest_collection_modifyitems(session, config, items):
    from tests import image_prebuild, image_records

    _NOTES.extend(image_records.deselect_unchanged(config, items))
    image_prebuild.order_last(items)


def pytest_terminal_summary(terminalreporter):
    for note in _NOTES:
        terminalreporter.write_line(note)


def pytest_collection_finish(session):
    from tests import image_prebuild

    if not session.config.option.collectonly:
        image_prebuild.remember(session.items)


def pytest_runtest_setup(item):
    from tests import image_prebuild

    ci_phases.running(item.nodeid)
    image_prebuild.start_before(item)


def pytest_sessionfinish(session, exitstatus):
    from tests import image_prebuild

    image_prebuild.stop()
    # Under pytest-xdist the controller writes the table (it gets every worker's reports); a worker writes nothing.
    if not session.config.option.collectonly and not os.environ.get("PYTEST_XDIST_WORKER"):
        workers = getattr(session.config.option, "numprocesses", None) or 1
        ci_phases.write(workers=workers if isinstance(workers, int) else 1,
                        append=os.environ.get("GRPO_CI_PHASES_APPEND") == "1")
    if _SKIPPED:
        print(f"\nGRPO_NO_SKIPS: {len(_SKIPPED)} test(s) skipped, which CI counts as failures:")
        for nodeid in _SKIPPED:
            print(f"  {nodeid}")
        session.exitstatus = 1
