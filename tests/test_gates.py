"""The project's static gates run with the tests, so one command checks everything.

A missing ruff or mypy fails its gate: a gate that skips itself when its tool is
absent passes exactly where nobody runs it. Install them with the test extras
(``pip install -e '.[test]'``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(module: str) -> list[str]:
    """``python -m <module>`` in this interpreter, or a failure saying how to get it."""
    if importlib.util.find_spec(module) is None:
        pytest.fail(
            f"{module} is not installed in this environment ({sys.executable}), so this gate "
            "cannot run. Install the test extras: pip install -e '.[test]'",
            pytrace=False,
        )
    return [sys.executable, "-m", module]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_lint_is_clean() -> None:
    result = _run(*_tool("ruff"), "check", "src", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _run(*_tool("ruff"), "format", "--check", "src", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_src_is_clean() -> None:
    result = _run(*_tool("mypy"))
    assert result.returncode == 0, result.stdout + result.stderr
