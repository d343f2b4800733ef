"""The house's lint (issue 46): ruff, with pyproject.toml's `[tool.ruff]` (pycodestyle errors and
warnings, pyflakes; lines up to 120 characters), is clean over the package, the tests and the
benchmarks. CI installs ruff with the test extra; without it the check is skipped with a reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    pytest.importorskip("ruff", reason="ruff is not installed (pip install -e '.[test]')")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "streamstudio", "tests", "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_lint_would_catch_a_mistake(tmp_path):
    """The configuration in force catches what it is for (an unused import, a line past 120)."""
    pytest.importorskip("ruff", reason="ruff is not installed (pip install -e '.[test]')")
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = '" + "a" * 130 + "'\n")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                           str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "F401" in done.stdout and "E501" in done.stdout, done.stdout
