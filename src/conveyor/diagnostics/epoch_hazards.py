"""Calls between epochs that would not reach the workers.

With persistent workers each worker keeps the copy of the dataset it made when it
started. torch's DataLoader never tells that copy of ``dataset.set_epoch(epoch)``: every
epoch then repeats the first one's shuffle, augmentations or curriculum, silently.
conveyor's makes the calls ``epoch_calls`` names on every worker's copy
(conveyor._task.dataset_calls), except a method it was told to leave out, or one it
cannot see called (an object without a ``__dict__``, a method that is an instance
attribute, a property, or comes through ``__getattr__``).
"""

from __future__ import annotations

from typing import Any

from .._task.dataset_calls import unwatched_names
from .findings import Finding, Severity

__all__ = ["LEFT_OUT", "UNWATCHED", "epoch_call_findings"]

LEFT_OUT = "set-epoch-persistent"  # set_epoch under torch's loader, or left out of epoch_calls
UNWATCHED = "epoch-call-unwatched"  # conveyor cannot see the method called

_WHY = (
    "A call of dataset.set_epoch(epoch) in the training loop changes the main process's "
    "dataset only; every worker goes on with the epoch its copy had when it started, so "
    "each epoch repeats the first one's shuffle, augmentations or curriculum, and nothing "
    "says so."
)


def epoch_call_findings(
    dataset: Any, *, num_workers: int, persistent: bool, epoch_calls: tuple[str, ...] | None
) -> list[Finding]:
    """What of the dataset's ``set_epoch`` (and ``epoch_calls``) would not reach workers
    that keep their copy across epochs. ``epoch_calls``: conveyor's loader's option;
    None: torch's loader, which makes no call on the workers' copies."""
    if num_workers == 0 or not persistent:
        return []  # a worker started each epoch copies the dataset as it is then
    kind = type(dataset).__name__
    findings = []
    if _has(dataset, "set_epoch") and not _shares_epoch(dataset):
        if epoch_calls is None:
            findings.append(_torch_loader(kind))
        elif "set_epoch" not in epoch_calls:
            findings.append(_left_out(kind, epoch_calls))
    if epoch_calls is not None:
        findings += [_unwatched(kind, name) for name in unwatched_names(dataset, epoch_calls)]
    return findings


def _torch_loader(kind: str) -> Finding:
    return Finding(
        code=LEFT_OUT,
        severity=Severity.WARNING,
        where="dataset.set_epoch",
        what=(
            f"{kind}.set_epoch() will not reach the workers: torch's DataLoader with "
            "persistent_workers=True keeps the copy of the dataset each worker made when "
            "it started"
        ),
        why=_WHY,
        fix=(
            "use conveyor's DataLoader (from conveyor import DataLoader), which makes the "
            "call on every worker's copy before that worker's next epoch; or "
            "persistent_workers=False, so that workers start each epoch from the dataset "
            "as it is then."
        ),
    )


def _left_out(kind: str, epoch_calls: tuple[str, ...]) -> Finding:
    return Finding(
        code=LEFT_OUT,
        severity=Severity.WARNING,
        where="dataset.set_epoch",
        what=(
            f"{kind}.set_epoch() will not reach the workers: epoch_calls={epoch_calls!r} "
            "leaves it out, and persistent workers keep the copy of the dataset they made "
            "when they started"
        ),
        why=_WHY,
        fix="add 'set_epoch' to epoch_calls (its default is ('set_epoch',)), or "
        "persistent_workers=False.",
    )


def _unwatched(kind: str, name: str) -> Finding:
    return Finding(
        code=UNWATCHED,
        severity=Severity.WARNING,
        where=f"dataset.{name}",
        what=(
            f"conveyor cannot see the calls of {kind}.{name}(), so they will not reach the "
            "persistent workers"
        ),
        why=(
            "conveyor learns of a call by standing in for the method on the dataset object "
            "itself (in its __dict__, never its class), and this one has no __dict__ "
            "(__slots__), or the method is an instance attribute, a property, or comes "
            "through __getattr__. Every worker goes on with the copy of the dataset it "
            "made when it started."
        ),
        fix=(
            f"define {name} as a method of the dataset's class, on an object with a "
            "__dict__ (the dataset given to the loader, not one inside it); or "
            "persistent_workers=False."
        ),
    )


def _has(dataset: Any, name: str) -> bool:
    try:
        return callable(getattr(dataset, name, None))
    except Exception:  # a __getattr__ of the dataset's own may raise anything
        return False


def _shares_epoch(dataset: Any) -> bool:
    """The dataset keeps its epoch in shared memory every worker's copy reads (Hugging
    Face ``datasets``' IterableDataset: a torch tensor, changed in place)."""
    epoch = (getattr(dataset, "__dict__", None) or {}).get("_epoch")
    is_shared = getattr(epoch, "is_shared", None)
    try:
        return callable(is_shared) and bool(is_shared())
    except Exception:
        return False
