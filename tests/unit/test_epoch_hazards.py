"""The pre-flight and ``conveyor doctor`` name a dataset's ``set_epoch`` that would not reach
persistent workers: under torch's DataLoader (which tells their copies nothing), under
conveyor's with ``epoch_calls`` leaving it out, or a method conveyor cannot see called.
Quiet where the call does reach them, or workers start afresh each epoch."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import conveyor
from conveyor import DataLoader, PreflightWarning, Severity, check

torch = pytest.importorskip("torch", reason="torch's own DataLoader is what is checked")
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402


class Epochs:
    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return self.epoch


class Plain:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i


class Slotted:
    __slots__ = ("epoch",)

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return self.epoch


class SharedEpoch(Epochs):
    """Keeps its epoch in shared memory, changed in place (Hugging Face datasets' way)."""

    def __init__(self) -> None:
        self._epoch = torch.tensor(0).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self._epoch += epoch - self._epoch


EPOCH_CODES = ("set-epoch-persistent", "epoch-call-unwatched")
THREADS = {"worker_method": "thread"}


def _epoch_findings(report: conveyor.Report) -> list[conveyor.Finding]:
    return [f for f in report.findings if f.code in EPOCH_CODES]


def test_torchs_loader_with_persistent_workers_is_named_with_the_fix() -> None:
    report = check(TorchDataLoader(Epochs(), num_workers=2, persistent_workers=True))
    (finding,) = _epoch_findings(report)
    assert (finding.code, finding.severity, finding.where) == (
        "set-epoch-persistent",
        Severity.WARNING,
        "dataset.set_epoch",
    )
    assert finding.message() == (
        "Epochs.set_epoch() will not reach the workers: torch's DataLoader with "
        "persistent_workers=True keeps the copy of the dataset each worker made when it "
        "started (at dataset.set_epoch). A call of dataset.set_epoch(epoch) in the training "
        "loop changes the main process's dataset only; every worker goes on with the epoch "
        "its copy had when it started, so each epoch repeats the first one's shuffle, "
        "augmentations or curriculum, and nothing says so. Fix: use conveyor's DataLoader "
        "(from conveyor import DataLoader), which makes the call on every worker's copy "
        "before that worker's next epoch; or persistent_workers=False, so that workers "
        "start each epoch from the dataset as it is then."
    )
    assert "Epochs (2 workers" in report.subject  # the loader's dataset and settings


@pytest.mark.parametrize(
    "loader",
    [
        lambda: TorchDataLoader(Epochs(), num_workers=2),  # workers start afresh each epoch
        lambda: TorchDataLoader(Plain(), num_workers=2, persistent_workers=True),
        lambda: TorchDataLoader(SharedEpoch(), num_workers=2, persistent_workers=True),
        lambda: DataLoader(Epochs(), num_workers=2, persistent_workers=True),
        lambda: DataLoader(Epochs(), num_workers=2, persistent_workers=True, **THREADS),
        lambda: DataLoader(Epochs(), num_workers=2, epoch_calls=()),
    ],
    ids=["torch-per-epoch", "torch-no-method", "torch-shared-epoch", "conveyor",
         "conveyor-threads", "conveyor-per-epoch"],
)  # fmt: skip
def test_quiet_where_the_call_reaches_the_workers_or_nothing_needs_it(loader: Any) -> None:
    assert _epoch_findings(check(loader())) == []


def test_conveyors_loader_with_set_epoch_left_out_is_named() -> None:
    loader = DataLoader(Epochs(), num_workers=2, persistent_workers=True, epoch_calls=())
    (finding,) = _epoch_findings(check(loader))
    assert finding.code == "set-epoch-persistent"
    assert "epoch_calls=() leaves it out" in finding.what
    assert finding.fix.startswith("add 'set_epoch' to epoch_calls")


def test_a_method_conveyor_cannot_see_is_warned_at_construction_and_checked() -> None:
    with pytest.warns(PreflightWarning, match=r"cannot see the calls of Slotted\.set_epoch") as w:
        loader = DataLoader(Slotted(), num_workers=2, persistent_workers=True)
    assert len(w) == 1 and w[0].filename == __file__  # at the user's DataLoader(...) line
    (finding,) = _epoch_findings(check(loader))
    assert (finding.code, finding.where) == ("epoch-call-unwatched", "dataset.set_epoch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DataLoader(Slotted(), num_workers=2)  # workers start afresh: nothing to say
        DataLoader(Slotted(), num_workers=2, persistent_workers=True, preflight=False)


def test_the_doctor_names_it_for_a_torch_loader(tmp_path: Path, monkeypatch: Any) -> None:
    from conveyor.doctor import examine, load_target, render
    from conveyor.doctor.advice import advise

    (tmp_path / "torch_loading.py").write_text(
        "from torch.utils.data import DataLoader\n"
        "from tests.unit.test_epoch_hazards import Epochs\n"
        "loader = DataLoader(Epochs(), batch_size=2, num_workers=2, persistent_workers=True)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    target = load_target("torch_loading:loader")
    assert (target.persistent_workers, target.epoch_calls) == (True, None)
    report, profile = examine(target, workers=(0,), batches=1)
    assert [f.code for f in report.warnings] == ["set-epoch-persistent"]
    out = render(target, profile, report, advise(profile, report.findings))
    assert "dataset.set_epoch  [set-epoch-persistent]" in out
    assert "- [set-epoch-persistent] dataset.set_epoch: use conveyor's DataLoader" in out
