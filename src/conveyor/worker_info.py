"""``get_worker_info()``: who am I, inside a worker process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _torch

__all__ = ["WorkerInfo", "get_worker_info"]


@dataclass(frozen=True)
class WorkerInfo:
    """Describes the worker process running the current code.

    ``dataset`` is this worker's own copy of the dataset: under ``spawn`` and
    ``forkserver`` it is a different object from the one in the main process.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


_current: WorkerInfo | None = None
_consulted = False  # the dataset asked (ours or torch's getter): it probably shards


def get_worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of this worker, or None in the main process."""
    global _consulted
    _consulted = True
    return _current


def consulted() -> bool:
    """Whether code in this worker called ``get_worker_info()`` (conveyor's or torch's)."""
    return _consulted


def set_worker_info(info: WorkerInfo) -> None:
    """Install ``info`` for this process (and for torch's own getter, if present)."""
    global _current
    _current = info

    # Datasets written for torch call torch.utils.data.get_worker_info() to
    # shard themselves; make that work in our workers too, also when the
    # worker imports torch only later.
    def install(torch: Any) -> None:
        from torch.utils.data._utils import worker as torch_worker

        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
        )
        torch_getter = torch_worker.get_worker_info

        def get_worker_info() -> Any:
            global _consulted
            _consulted = True
            return torch_getter()

        # Asking is what a sharding dataset does: note it (DuplicateDataWarning).
        torch_worker.get_worker_info = get_worker_info
        torch.utils.data.get_worker_info = get_worker_info

    _torch.on_import(install)
