"""accelerate with conveyor loading (conveyor.integrations.accelerate.prepare): each
process gets the batches accelerate gives it with torch's loader, and the gradient
accumulation learns where each epoch ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("accelerate_run.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(processes: int, tmp_path: Path) -> list[dict[str, Any]]:
    pytest.importorskip("accelerate", reason="CI installs accelerate (.ci/run)")
    out = tmp_path / f"run{processes}"
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc_per_node={processes}"]
    done = subprocess.run(
        [*launcher, str(SCRIPT), str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in range(processes)]


@pytest.mark.parametrize("processes", [1, 2])
def test_prepare_keeps_accelerates_shards_with_conveyor_loading(
    processes: int, tmp_path: Path
) -> None:
    ranks = _run(processes, tmp_path)
    seen_all = []
    for report in ranks:
        theirs, ours = report["torch"], report["conveyor"]
        assert ours["loader"] == "conveyor.loader" and ours["on_error"] == "skip"
        assert ours["epochs"] == theirs["epochs"]  # batches, order and gradient syncs
        for epoch in ours["epochs"]:
            # accumulation of 4: the epoch's last step synchronises too
            assert epoch["syncs"][-1] is True
        seen_all += [i for batch in ours["epochs"][0]["seen"] for i in batch]
    assert sorted(seen_all) == list(range(80))  # the processes' shards make up the dataset
