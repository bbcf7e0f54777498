"""accelerate with conveyor loading: each process gets the batches accelerate gives it with
torch's loader, and the gradient accumulation learns where each epoch ends; through
``conveyor.integrations.accelerate.prepare`` and through conveyor's ``Accelerator``, whose
``prepare(model, optimizer, loader)`` and ``skip_first_batches`` keep conveyor loading.
accelerate's own ``prepare`` replaces a conveyor loader with torch's: conveyor says so
once, naming the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from . import child_env

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
        env=child_env(PYTHONWARNINGS="ignore"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in range(processes)]


@pytest.fixture(scope="module", params=[1, 2], ids=["1-process", "2-processes"])
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _run(request.param, tmp_path_factory.mktemp("accelerate"))


@pytest.mark.parametrize("way", ["function", "subclass"])
def test_conveyor_loads_with_accelerates_shards(way: str, ranks: list[dict[str, Any]]) -> None:
    seen_all = []
    for report in ranks:
        theirs, ours = report["torch"], report[way]
        assert ours["loader"] == "conveyor.loader" and ours["on_error"] == "skip"
        assert ours["warnings"] == []
        assert ours["epochs"] == theirs["epochs"]  # batches, order and gradient syncs
        # The loader accelerate rebuilt reads as torch's (batch_size, sampler, drop_last,
        # length, the batch sampler it sharded and the sampler within: issue 43).
        assert ours["seen_as"] == theirs["seen_as"]
        for epoch in ours["epochs"]:
            # accumulation of 4: the epoch's last step synchronises too
            assert epoch["syncs"][-1] is True
        seen_all += [i for batch in ours["epochs"][0]["seen"] for i in batch]
    assert sorted(seen_all) == list(range(80))  # the processes' shards make up the dataset


def test_skip_first_batches_keeps_conveyor_loading(ranks: list[dict[str, Any]]) -> None:
    for report in ranks:
        theirs, ours = report["torch_skipped"], report["subclass_skipped"]
        assert ours["loader"] == "conveyor.loader" and ours["on_error"] == "skip"
        assert ours["epochs"] == theirs["epochs"]
        assert ours["seen_as"] == theirs["seen_as"]
        assert len(ours["epochs"][0]["seen"]) == 80 // 4 // len(ranks) - 3


def test_accelerates_own_prepare_says_once_that_torch_loads_and_names_the_fix(
    ranks: list[dict[str, Any]],
) -> None:
    for report in ranks:
        plain = report["plain"]
        assert plain["loader"] == "torch.utils.data.dataloader"  # replaced, as before
        assert [w["category"] for w in plain["warnings"]] == ["LoaderReplacedWarning"]
        warning = plain["warnings"][0]
        assert warning["filename"] == str(SCRIPT)  # the user's accelerator.prepare() line
        message = warning["message"]
        assert "replacing this conveyor DataLoader with a torch DataLoader" in message
        assert "options (max_worker_restarts=5, on_error='skip')" in message  # what is lost
        assert "`from conveyor.integrations.accelerate import Accelerator`" in message
        assert "conveyor.integrations.accelerate.prepare(accelerator, loader)" in message


RESUME = Path(__file__).with_name("accelerate_resume.py")


def _torchrun(processes: int, out: Path, phase: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}"]
    return subprocess.run(
        [*command, str(RESUME), str(out), phase],
        env=child_env(PYTHONWARNINGS="ignore"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_save_state_and_load_state_resume_the_epoch_on_another_number_of_processes(
    tmp_path: Path,
) -> None:
    """2 processes save their state (each its own; accelerate keeps one) and are killed;
    3 processes load the last one's and finish the epoch: every sample once."""
    pytest.importorskip("accelerate", reason="CI installs accelerate (.ci/run)")
    out = tmp_path / "run"
    first = _torchrun(2, out, "first")
    assert first.returncode != 0 and "SIGKILL" in first.stderr, first.stderr[-3000:]
    resumed = _torchrun(3, out, "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = []
    for phase, ranks in (("first", 2), ("resume", 3)):
        for rank in range(ranks):
            lines = Path(f"{out}.{phase}.{rank}.jsonl").read_text().splitlines()
            steps += [json.loads(line) for line in lines]
    assert sorted(i for ids in steps for i in ids) == list(range(96))
