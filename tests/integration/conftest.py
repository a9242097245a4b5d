"""Integration tests share the session's real engine and cpu image (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
