"""Helpers the tests share (importable as ``support``: pyproject's pythonpath holds tests/)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
