"""Run by test_lightning.py: ``python lightning_ddp.py LOADER OUT STRATEGY``.

Trains one epoch of a no-op model on 2 CPU ranks, validating once, and writes, per rank,
the sample ids its training steps saw and what the loaders Lightning rebuilt (to inject
its ``DistributedSampler``) look like to code that reads them. ``LOADER``:

- ``torch`` or ``conveyor``: ``DataLoader(ds, batch_size=4, shuffle=True)`` made before
  ``fit`` and looked at (a batch drawn), as a user does: ``ddp_spawn`` pickles it, and
  Lightning rebuilds it from its attributes;
- ``torch-subclass`` or ``conveyor-subclass``: a ``DataLoader`` subclass whose ``__init__``
  fixes ``batch_size``, made in the ``*_dataloader`` hooks, where Lightning records the
  arguments to rebuild it with (its documented way for such subclasses).

The model is in lightning_model.py, and the loaders' pieces are taken from this module
under its own name (not ``__main__``): a spawned worker unpickles them without Lightning.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils.data import DataLoader as TorchDataLoader

from conveyor import DataLoader as ConveyorDataLoader

OPTIONS = {"on_error": "skip", "max_worker_restarts": 5, "reseed": "batch"}


class Toy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


class FixedTorch(TorchDataLoader):  # type: ignore[type-arg]
    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size=4, **kwargs)


class FixedConveyor(ConveyorDataLoader):
    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size=4, **kwargs)


def make(loader: str, shuffle: bool) -> Any:
    kind = loader.removesuffix("-subclass")
    extra = {"num_workers": 1, **(OPTIONS if kind == "conveyor" else {})}
    if loader.endswith("-subclass"):
        fixed = FixedConveyor if kind == "conveyor" else FixedTorch
        return fixed(Toy(), shuffle=shuffle, **extra)
    made = ConveyorDataLoader if kind == "conveyor" else TorchDataLoader
    return made(Toy(), batch_size=4, shuffle=shuffle, **extra)


def describe(loader: Any) -> dict[str, Any]:
    """What frameworks and training scripts read of a loader (docs/frameworks.md)."""
    sampler, batches = loader.sampler, loader.batch_sampler
    return {
        "module": type(loader).__module__,
        "conveyor": isinstance(loader, ConveyorDataLoader),
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "len": len(loader),
        "sampler": f"{type(sampler).__module__}.{type(sampler).__qualname__}",
        "batch_sampler": f"{type(batches).__module__}.{type(batches).__qualname__}",
        "inner_is_sampler": getattr(batches, "sampler", None) is sampler,
        "shuffle": getattr(sampler, "shuffle", None),
        "replicas": [getattr(sampler, "num_replicas", None), getattr(sampler, "rank", None)],
        "epoch": getattr(sampler, "epoch", None),
        **{name: getattr(loader, name, None) for name in OPTIONS},
    }


if __name__ == "__main__":
    # Lightning, and the model, only here: ``ddp_spawn`` starts the loaders' workers with
    # spawn, and each imports this script again (importing Lightning costs 8 s of CPU).
    import lightning as L

    from tests.frameworks.lightning_model import Model

    torch.manual_seed(0)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=2,
        strategy=sys.argv[3],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Model(sys.argv[1], sys.argv[2]))
    # As a training script should: Lightning leaves gloo's process group (and its threads)
    # to the interpreter's exit, where torch 2.14 aborts now and then.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
