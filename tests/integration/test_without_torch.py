"""``import conveyor`` and a whole loop (workers, checkpoint, reseed) with torch's import
blocked: torch is optional at runtime, and nothing imports it behind the user's back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("scripts") / "without_torch.py"


@pytest.mark.parametrize(
    "methods", [["inline", "fork", "forkserver"], pytest.param(["spawn"], marks=pytest.mark.slow)]
)
def test_a_whole_loop_runs_with_torch_blocked(methods: list[str], tmp_path: Path) -> None:
    blocked = tmp_path / "torch"
    blocked.mkdir()
    (blocked / "__init__.py").write_text('raise ImportError("torch is blocked for this test")\n')
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *methods],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")
