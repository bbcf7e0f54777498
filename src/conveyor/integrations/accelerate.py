"""Hugging Face accelerate, with conveyor doing the loading.

``accelerator.prepare(loader)`` always builds a *torch* ``DataLoader`` from the
loader's attributes (inside its ``DataLoaderShard``), so conveyor's loader would be
silently replaced by torch's. :func:`prepare` lets accelerate do everything it
does — shard the batches over its processes, synchronise the shuffling generator,
move batches to the device, tell the gradient accumulation where an epoch ends —
and then puts a conveyor loader, with the same batches and every conveyor option,
where accelerate put torch's::

    from conveyor.integrations.accelerate import prepare

    loader = prepare(accelerator, DataLoader(dataset, batch_size=32, shuffle=True,
                                             num_workers=4, on_error="skip"))
    model, optimizer = accelerator.prepare(model, optimizer)
"""

from __future__ import annotations

from typing import Any

from conveyor import DataLoader

__all__ = ["prepare"]

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
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"prepare() takes a conveyor DataLoader, got {type(loader).__name__}: for other "
            "loaders call accelerator.prepare() itself"
        )
    prepared = accelerator.prepare(loader)
    prepared.base_dataloader = _conveyor_twin(loader, prepared.base_dataloader)
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
