"""The peers' own data-loader test files, run with conveyor in torch's place
(``tools/accelerate_suite.py``, ``tools/torch_suite.py``): every test that passes with
torch's loader passes with conveyor's, or is listed in the tool with its reason.

Their files are not ours and are never committed: each test skips, saying where to put
the pinned copy (``.upstream/`` or ``$CONVEYOR_UPSTREAM``), when it or what the file
needs is missing. CI's full run has the accelerate lane run them (.ci/run).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.mark.timeout(3600)  # torch's file with and without conveyor: minutes, not seconds
@pytest.mark.parametrize("tool", ["accelerate_suite.py", "torch_suite.py"])
def test_each_test_that_passes_with_torchs_loader_passes_with_conveyors(tool: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / tool)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if done.returncode == 2:  # the copy, or a package the file needs, is missing here
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
