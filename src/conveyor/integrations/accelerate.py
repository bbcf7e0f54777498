"""Hugging Face accelerate, with conveyor doing the loading.

``accelerator.prepare(loader)`` always builds a *torch* ``DataLoader`` from the
loader's attributes (inside its ``DataLoaderShard``; accelerate 1.15 has no hook for
the class it builds), so conveyor's loader would be replaced by torch's: conveyor
warns when that happens (``LoaderReplacedWarning``). Two ways keep conveyor loading.
Both let accelerate do everything it does — shard the batches over its processes,
synchronise the shuffling generator, move batches to the device, tell the gradient
accumulation where an epoch ends — and then put a conveyor loader, with the same
batches and every conveyor option, where accelerate put torch's:

- the :class:`Accelerator` here, accelerate's own with that one change: the usual
  ``accelerator.prepare(model, optimizer, loader)`` and ``skip_first_batches`` keep
  conveyor loading::

      from conveyor.integrations.accelerate import Accelerator   # was: from accelerate

      accelerator = Accelerator()
      model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

- :func:`prepare`, for an accelerator made elsewhere::

      from conveyor.integrations.accelerate import prepare

      loader = prepare(accelerator, DataLoader(dataset, batch_size=32, shuffle=True,
                                               num_workers=4, on_error="skip"))
      model, optimizer = accelerator.prepare(model, optimizer)

Checkpoints: with ``DataLoaderConfiguration(use_stateful_dataloader=True)``,
``accelerator.save_state()`` saves the conveyor loader's state and ``load_state()``
resumes it at the next batch, also on another number of processes (whichever
process's state accelerate finds in the directory: each says where the whole epoch
stands). conveyor's loader is stateful itself, so this needs no torchdata. Without that
option accelerate saves no loader state: resume with ``skip_first_batches`` as usual.

Not tested: TPUs (XLA), where accelerate wraps the loader in a device loader; one without
a ``base_dataloader`` to replace keeps torch's loader, with a ``LoaderReplacedWarning``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from conveyor import DataLoader, LoaderReplacedWarning
from conveyor.integrations.replaced import prepared_by_conveyor

__all__ = ["Accelerator", "prepare"]

# torch's arguments accelerate passes on to the loader it builds.
_TORCH_OPTIONS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def prepare(accelerator: Any, loader: DataLoader) -> Any:
    """``accelerator.prepare(loader)``, with conveyor's loader doing the loading."""
    if not _unprepared(loader):
        raise TypeError(
            f"prepare() takes a conveyor DataLoader, got {type(loader).__name__}: for other "
            "loaders call accelerator.prepare() itself"
        )
    with prepared_by_conveyor(loader), _stateful_by_conveyor(accelerator) as stateful:
        prepared = accelerator.prepare(loader)
    return _loading_with(loader, prepared, stateful)


@contextlib.contextmanager
def _stateful_by_conveyor(accelerator: Any) -> Iterator[bool]:
    """Whether the user asked accelerate to checkpoint the loader's state; meanwhile
    accelerate builds torch's plain loader, not torchdata's (conveyor's replaces it, and
    it keeps a state of its own)."""
    config: Any = getattr(accelerator, "dataloader_config", None)
    asked = bool(getattr(config, "use_stateful_dataloader", False))
    if asked:
        config.use_stateful_dataloader = False
    try:
        yield asked
    finally:
        if asked:
            config.use_stateful_dataloader = True


def _unprepared(loader: Any) -> bool:
    """A conveyor loader itself (a prepared one claims to be of its base's class)."""
    return issubclass(type(loader), DataLoader)


def _loading_with(loader: DataLoader, prepared: Any, stateful: bool = False) -> Any:
    """``prepared`` (accelerate's wrapper), loading with a conveyor twin of ``loader``;
    ``stateful``: accelerate's checkpoints carry the loader's state."""
    made = getattr(prepared, "base_dataloader", None)
    if made is None:
        warnings.warn(
            f"accelerate wrapped the loader in a {type(prepared).__name__}, which conveyor "
            "cannot reach into: torch's DataLoader will load the data there.",
            LoaderReplacedWarning,
            stacklevel=3,
        )
    elif not isinstance(made, DataLoader):  # not twinned already (a nested prepare)
        prepared.base_dataloader = _conveyor_twin(loader, made)
        if stateful:
            # accelerate saves and loads dl_state_dict when this is set; until the first
            # batch it is the replaced loader's: an empty state (nothing delivered yet).
            prepared.use_stateful_dataloader = True
            prepared.dl_state_dict = {}
    return prepared


def _conveyor_twin(loader: DataLoader, made: Any) -> DataLoader:
    """A conveyor loader giving the batches accelerate's torch loader ``made`` gives."""
    kwargs: dict[str, Any] = {name: getattr(made, name) for name in _TORCH_OPTIONS}
    kwargs["prefetch_factor"] = made.prefetch_factor if made.num_workers else None
    kwargs.update({name: getattr(loader, name) for name in DataLoader.conveyor_options})
    if made.batch_sampler is not None:
        return DataLoader(made.dataset, batch_sampler=made.batch_sampler, **kwargs)
    return DataLoader(
        made.dataset, batch_size=None, sampler=made.sampler, drop_last=made.drop_last, **kwargs
    )


try:
    import accelerate
except ImportError:  # prepare() takes the accelerator it is given; Accelerator needs it
    pass
else:

    class Accelerator(accelerate.Accelerator):
        """accelerate's ``Accelerator``, whose ``prepare`` (and ``prepare_data_loader``,
        ``skip_first_batches``) keep a conveyor loader loading with conveyor."""

        def prepare_data_loader(self, data_loader: Any, *args: Any, **kwargs: Any) -> Any:
            """accelerate's, then a conveyor loader in place of the torch one it built
            (other loaders: accelerate's alone)."""
            if not _unprepared(data_loader):
                return super().prepare_data_loader(data_loader, *args, **kwargs)
            with prepared_by_conveyor(data_loader), _stateful_by_conveyor(self) as stateful:
                prepared = super().prepare_data_loader(data_loader, *args, **kwargs)
            return _loading_with(data_loader, prepared, stateful)

        def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
            """accelerate's, loading with conveyor: the prepared loader without its
            first ``num_batches`` batches."""
            # accelerate builds torch's loader again, from the prepared one's attributes
            # (those of the conveyor loader within): a twin of that conveyor loader.
            skipped = super().skip_first_batches(dataloader, num_batches)
            ours: Any = getattr(dataloader, "base_dataloader", None)
            if _unprepared(ours):
                return _loading_with(ours, skipped)
            return skipped
