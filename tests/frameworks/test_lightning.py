"""Lightning trains on conveyor's loader as on torch's: the same order on one device,
each rank exactly torch's shard under DDP, and conveyor's options kept when Lightning
rebuilds the loader to inject its DistributedSampler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor import DataLoader as ConveyorDataLoader

torch = pytest.importorskip("torch", reason="Lightning trains with torch: needs torch")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]
SCRIPT = Path(__file__).with_name("lightning_ddp.py")


def _fit(loader: str, tmp_path: Path) -> list[int]:
    # Imported here, not at collection: lightning takes seconds to import, and the
    # default run (which deselects these slow tests) should not pay for it.
    L = pytest.importorskip("lightning", reason="CI installs lightning (.ci/run)")
    from .lightning_ddp import Model

    torch.manual_seed(0)
    model = Model(loader, str(tmp_path / loader))
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    assert isinstance(trainer.train_dataloader, ConveyorDataLoader) == (loader == "conveyor")
    return model.seen


def test_one_device_sees_torchs_order(tmp_path: Path) -> None:
    assert _fit("conveyor", tmp_path) == _fit("torch", tmp_path)


def _ranks(loader: str, strategy: str, tmp_path: Path) -> list[dict[str, Any]]:
    pytest.importorskip("lightning", reason="CI installs lightning (.ci/run)")
    out = tmp_path / f"{loader}-{strategy}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run(
        [sys.executable, "-W", "ignore", str(SCRIPT), loader, str(out), strategy],
        check=True,
        env=env,
        timeout=240,
        capture_output=True,
    )
    return [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_each_ddp_rank_gets_torchs_shard(strategy: str, tmp_path: Path) -> None:
    torch_ranks = _ranks("torch", strategy, tmp_path)
    ranks = _ranks("conveyor", strategy, tmp_path)
    for ours, theirs in zip(ranks, torch_ranks, strict=True):
        assert ours["seen"] == theirs["seen"]  # the same shard, in the same order
        assert ours["module"] == "conveyor.loader"  # conveyor's loader did the loading
        assert (ours["on_error"], ours["max_worker_restarts"]) == ("skip", 5)  # kept
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == list(range(32))


RESUME = Path(__file__).with_name("lightning_resume.py")


def _lightning(out: Path, devices: int, *resume: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-W", "ignore", str(RESUME), str(out), str(devices), *resume]
    return subprocess.run(command, env=env, timeout=300, capture_output=True, text=True)


def _steps(log: Path, ranks: int) -> list[dict[str, Any]]:
    lines = []
    for rank in range(ranks):
        lines += [json.loads(line) for line in Path(f"{log}.{rank}.jsonl").read_text().splitlines()]
    return lines


def test_a_preempted_ddp_run_resumes_from_its_checkpoint_on_4_or_2_devices(tmp_path: Path) -> None:
    """Lightning's own mid-epoch checkpoint of a 4-device DDP run (every rank then
    SIGKILLed), resumed with ``ckpt_path=`` on 4 devices and on 2: the second epoch
    delivers every sample exactly once over both runs. (Lightning calls ``iter()`` on the
    loader before ``set_epoch``: the state's epoch must win; Lightning saves rank 0's
    loader state only: it must speak for every rank.)"""
    pytest.importorskip("lightning", reason="CI installs lightning (.ci/run)")
    out = tmp_path / "run"
    first = _lightning(out, 4)
    assert first.returncode == -9, first.stderr[-3000:]  # killed right after its checkpoint
    before = [s["ids"] for s in _steps(Path(f"{out}.first"), 4) if s["epoch"] == 1]
    assert len(before) == 4 * 2  # two steps of the second epoch on each rank
    for devices in (4, 2):
        resumed = _lightning(out, devices, f"{out}.ckpt")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        after = [s["ids"] for s in _steps(Path(f"{out}.resumed{devices}"), devices)]
        assert all(s["epoch"] == 1 for s in _steps(Path(f"{out}.resumed{devices}"), devices))
        seen = sorted(i for ids in before + after for i in ids)
        assert seen == list(range(96)), f"resumed on {devices} devices"
