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
"""

from __future__ import annotations

import json
import sys
from typing import Any

import lightning as L
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


class Model(L.LightningModule):
    def __init__(self, loader: str, out: str) -> None:
        super().__init__()
        self.loader, self.out = loader, out
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[int] = []
        self.made: dict[str, Any] = {}
        if not loader.endswith("-subclass"):  # made before fit, and looked at
            self.made = {"train": make(loader, True), "val": make(loader, False)}
            next(iter(self.made["train"]))

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        self.seen += batch[:, 0].int().tolist()
        return self.layer(batch).sum()

    def validation_step(self, batch: torch.Tensor, index: int) -> None:
        pass

    def on_train_epoch_end(self) -> None:
        trainer = self.trainer
        report = {
            "rank": self.global_rank,
            "seen": self.seen,
            "train": describe(trainer.train_dataloader),
            "val": describe(trainer.val_dataloaders),
        }
        with open(f"{self.out}.{self.global_rank}.json", "w") as f:
            json.dump(report, f)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self) -> Any:
        return self.made["train"] if self.made else make(self.loader, True)

    def val_dataloader(self) -> Any:
        return self.made["val"] if self.made else make(self.loader, False)


if __name__ == "__main__":
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
