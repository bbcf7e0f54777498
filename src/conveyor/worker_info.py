"""``get_worker_info()``: who am I, inside a worker."""

from __future__ import annotations

from typing import Any

from conveyor import _torch
from conveyor._workers import scope as _scope
from conveyor._workers.scope import (
    WorkerInfo,  # defined beside the scope that holds it; public here
)

__all__ = ["WorkerInfo", "get_worker_info"]


def get_worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of the worker running this code, or None in the main
    process (in a thread worker: that thread's own)."""
    scope = _scope.current()
    if scope is None:
        return None
    scope.consulted = True
    return scope.info


def consulted() -> bool:
    """Whether code in this worker called ``get_worker_info()`` (conveyor's or torch's)."""
    scope = _scope.current()
    return scope is not None and scope.consulted


def install_in_torch(scope: _scope.WorkerScope, *, process_wide: bool) -> None:
    """Make torch's ``get_worker_info()`` answer for conveyor's workers too (datasets
    written for torch call it to shard themselves), also when the worker imports torch
    only later. ``process_wide``: the process has one worker, whose info also goes in
    torch's module global (for code that kept torch's original function)."""

    def install(torch: Any) -> None:
        from torch.utils.data._utils import worker as torch_worker

        if process_wide:
            torch_worker._worker_info = _as_torchs(scope, torch_worker)
        if getattr(torch_worker.get_worker_info, "_conveyor", False):
            return
        torch_getter = torch_worker.get_worker_info

        def get_worker_info() -> Any:
            current = _scope.current()
            if current is None or current.info is None:
                return torch_getter()
            # Asking is what a sharding dataset does: note it (DuplicateDataWarning).
            current.consulted = True
            return _as_torchs(current, torch_worker)

        get_worker_info._conveyor = True  # type: ignore[attr-defined]
        torch_worker.get_worker_info = get_worker_info
        torch.utils.data.get_worker_info = get_worker_info

    _torch.on_import(install)


def _as_torchs(scope: _scope.WorkerScope, torch_worker: Any) -> Any:
    """The scope's info as torch's own ``WorkerInfo`` (made once per worker)."""
    if scope.torch_info is None:
        info = scope.info
        assert info is not None
        fields: dict[str, Any] = {"id": info.id, "num_workers": info.num_workers, "seed": info.seed}
        known = getattr(torch_worker.WorkerInfo, "__dataclass_fields__", {})
        if "rng" in known:  # torch 2.13 and later
            fields.update(rng=info.rng, worker_method=info.worker_method)
        scope.torch_info = torch_worker.WorkerInfo(dataset=info.dataset, **fields)
    return scope.torch_info
