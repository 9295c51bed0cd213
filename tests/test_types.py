"""The type checker passes on backend/ and tui/ (the files [tool.mypy] names in pyproject.toml).

Type findings have been real bugs here: a widget method that shadowed Textual's own
``DOMNode.set_styles``, a sync override of Textual's async ``action_back``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(600)


def test_mypy_finds_nothing(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success: no issues found" in res.stdout
