"""The model lightning_ddp.py trains (and test_lightning.py on one device): it records
the sample ids its training steps saw, and what the loaders Lightning rebuilt look like.
Apart from the script, so that the loaders' workers never import Lightning."""

from __future__ import annotations

import json
from typing import Any

import lightning as L
import torch

from tests.frameworks.lightning_ddp import describe, make


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
