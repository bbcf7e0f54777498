"""benchmarks/gpu_check.py: without a CUDA device it says so and measures nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _script(monkeypatch: pytest.MonkeyPatch) -> object:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", module)  # (its dataclass looks itself up)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpu_check = _script(monkeypatch)
    assert gpu_check.main([]) == gpu_check.NO_CUDA == 2  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "no CUDA device here" in out and "Nothing was measured" in out
    assert "|" not in out  # no table
