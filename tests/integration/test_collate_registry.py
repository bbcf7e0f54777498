"""Collate functions registered in a script's ``__main__`` (types defined there too) reach
spawned and forkserver workers, which do not run ``__main__`` again; and conveyor's own
map works with torch's import blocked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).with_name("scripts")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.slow  # a fresh interpreter whose workers import torch (~15 s on two busy cores);
# the default run sends registrations to forkserver workers in tests/parity
def test_registrations_made_in_main_reach_the_workers(method: str) -> None:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "registered_in_main.py"), method],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("method", ["inline", "fork", "forkserver", "spawn"])
def test_conveyors_map_without_torch(method: str, tmp_path: Path) -> None:
    blocked = tmp_path / "torch"
    blocked.mkdir()
    (blocked / "__init__.py").write_text('raise ImportError("torch is blocked for this test")\n')
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "registered_without_torch.py"), method],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
