"""Paths of the student recipes (the trained tiny student is a session fixture in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "student" / "configs" / "tiny.yaml"
