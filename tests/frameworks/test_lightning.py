"""Lightning trains on conveyor's loader as on torch's: the same order on one device,
each rank exactly torch's shard under DDP, and conveyor's options kept when Lightning
rebuilds the loader to inject its DistributedSampler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor import DataLoader as ConveyorDataLoader

from . import child_env

torch = pytest.importorskip("torch", reason="Lightning trains with torch: needs torch")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]
SCRIPT = Path(__file__).with_name("lightning_ddp.py")
SCRIPT_MODULE = "tests.frameworks.lightning_ddp"  # where the script's loader classes live


def _fit(loader: str, tmp_path: Path) -> list[int]:
    # Imported here, not at collection: lightning takes seconds to import, and the
    # default run (which deselects these slow tests) should not pay for it.
    L = pytest.importorskip("lightning", reason="CI installs lightning (.ci/run)")
    from .lightning_model import Model

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


# conveyor's options, each away from its default (threads: no process to start here).
OPTIONS = {
    "on_error": "skip", "max_errors": 0.5, "max_worker_restarts": 7, "stall_warning": 5.0,
    "on_timeout": "restart", "timeout": 30.0, "preflight": False, "snapshot_every_n_steps": 3,
    "reseed": "sample", "run_ahead": False, "worker_method": "thread",
}  # fmt: skip


@pytest.mark.parametrize("in_hook", [False, True], ids=["made-anywhere", "made-in-a-hook"])
def test_a_loader_lightning_and_fabric_rebuild_keeps_conveyors_options(in_hook: bool) -> None:
    """Both ways Lightning (and Fabric) rebuild a loader: from the arguments recorded in a
    ``*_dataloader`` hook, or from the public attributes named like its parameters. Made
    in a hook, a state loaded before the rebuild is replayed onto the new loader too."""
    pytest.importorskip("lightning", reason="CI installs lightning (.ci/run)")
    from lightning.fabric.utilities.data import _replace_dunder_methods
    from lightning.fabric.utilities.data import _update_dataloader as fabric_update
    from lightning.pytorch.utilities.data import _update_dataloader

    data = list(range(20))

    def made() -> ConveyorDataLoader:
        return ConveyorDataLoader(data, batch_size=4, shuffle=True, num_workers=2, **OPTIONS)

    torch.manual_seed(0)
    first = made()
    iterator = iter(first)
    next(iterator)
    state, rest = first.state_dict(), [b.tolist() for b in iterator]
    if in_hook:
        with _replace_dunder_methods(torch.utils.data.DataLoader, "dataset"):
            loader = made()
            loader.load_state_dict(state)
    else:
        loader = made()
    for update in (_update_dataloader, fabric_update):
        rebuilt = update(loader, loader.sampler)
        assert type(rebuilt) is ConveyorDataLoader and rebuilt is not loader
        assert {name: getattr(rebuilt, name) for name in OPTIONS} == OPTIONS
        assert (rebuilt.batch_size, rebuilt.sampler) == (4, loader.sampler)
        if in_hook:  # the state loaded before: the rest of that epoch
            assert [b.tolist() for b in rebuilt] == rest


def _ranks(loader: str, strategy: str, tmp_path: Path) -> list[dict[str, Any]]:
    pytest.importorskip("lightning", reason="CI installs lightning (.ci/run)")
    out = tmp_path / f"{loader}-{strategy}"
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(SCRIPT), loader, str(out), strategy],
        env=env,
        timeout=600,  # 2 ranks importing Lightning on CI's busy cores: minutes
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in (0, 1)]


# What Lightning's rebuilt loaders must show as torch's do (issue 43): batch_size (None
# when Lightning took conveyor's batch sampler for a custom one), the DistributedSampler
# it injected as ``loader.sampler`` (not a SequentialSampler over the whole dataset),
# shuffle, the ranks, the epoch set_epoch gave, drop_last and the length.
SEEN_AS_TORCHS = (
    "batch_size", "drop_last", "len", "sampler", "batch_sampler", "inner_is_sampler",
    "shuffle", "replicas", "epoch",
)  # fmt: skip


def _seen_as_torchs(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    for stage in ("train", "val"):
        assert {k: ours[stage][k] for k in SEEN_AS_TORCHS} == {
            k: theirs[stage][k] for k in SEEN_AS_TORCHS
        }, stage
        assert ours[stage]["conveyor"] and not theirs[stage]["conveyor"]  # conveyor's loads
        assert (ours[stage]["on_error"], ours[stage]["max_worker_restarts"]) == ("skip", 5)
        assert ours[stage]["reseed"] == "batch"  # conveyor's options kept by the rebuild
    assert ours["train"]["sampler"] == "torch.utils.data.distributed.DistributedSampler"
    assert ours["train"]["batch_size"] == 4 and ours["train"]["shuffle"] is True


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_each_ddp_rank_gets_torchs_shard_and_sees_torchs_loader(
    strategy: str, tmp_path: Path
) -> None:
    """A loader made before ``fit`` and looked at (``ddp_spawn`` pickles it): each rank
    gets torch's shard, and the loader Lightning rebuilt reads as torch's."""
    torch_ranks = _ranks("torch", strategy, tmp_path)
    ranks = _ranks("conveyor", strategy, tmp_path)
    for ours, theirs in zip(ranks, torch_ranks, strict=True):
        assert ours["seen"] == theirs["seen"]  # the same shard, in the same order
        assert ours["train"]["module"] == "conveyor.loader"  # conveyor's loader did the loading
        _seen_as_torchs(ours, theirs)
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == list(range(32))


def test_a_subclass_that_fixes_batch_size_is_rebuilt_as_torchs(tmp_path: Path) -> None:
    """Lightning rebuilds a DataLoader subclass whose ``__init__`` fixes ``batch_size``
    from the arguments it recorded in the hook; conveyor's was refused with a
    MisconfigurationException (its batch sampler taken for a custom one)."""
    torch_ranks = _ranks("torch-subclass", "ddp", tmp_path)
    ranks = _ranks("conveyor-subclass", "ddp", tmp_path)
    for ours, theirs in zip(ranks, torch_ranks, strict=True):
        assert ours["seen"] == theirs["seen"]
        assert ours["train"]["module"] == theirs["train"]["module"] == SCRIPT_MODULE
        _seen_as_torchs(ours, theirs)


RESUME = Path(__file__).with_name("lightning_resume.py")


def _lightning(out: Path, devices: int, *resume: str) -> subprocess.CompletedProcess[str]:
    env = child_env()
    command = [sys.executable, "-W", "ignore", str(RESUME), str(out), str(devices), *resume]
    return subprocess.run(command, env=env, timeout=600, capture_output=True, text=True)


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
