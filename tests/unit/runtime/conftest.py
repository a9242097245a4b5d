"""Shared fixtures for the runtime unit tests; registers the `gpu` marker."""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped where there is none)")
